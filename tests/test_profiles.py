"""Profiles are params.yaml plus overrides defined once; every profile is a valid params file."""

import dataclasses
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, script, write_profile
from pipeline import profiles
from pipeline.core.params import ablation_variants, parse_params


@pytest.mark.parametrize("name", sorted(profiles.PROFILES))
def test_every_profile_validates_and_names_itself(name):
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    params = parse_params(profiles.apply(raw, name))
    assert params.base.profile == name
    assert raw["base"]["profile"] == "paper"  # the base mapping is not changed


def test_gpu_profile_settings():
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    params = parse_params(profiles.apply(raw, "gpu"))
    train = params.train
    assert (train.epochs, train.amp, train.compile, train.deterministic, train.device) == (50, True, True, False, "cuda")
    assert params.prepare.multimnist_pairs_per_digit == 100  # 1M test pairs; the paper profile keeps 1,000
    assert raw["prepare"]["multimnist_pairs_per_digit"] == 1000


def test_gpu_profile_compresses_the_papers_schedule_and_paper_gpu_keeps_it():
    """The gpu profile's 50 epochs end at the learning rate the paper's 640 end at (its runs before
    this were cut at 62 % of the start); paper-gpu trains the paper protocol on the fast path."""
    from pipeline.training.config import run_config
    from pipeline.training.train import _lr_lambda

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    gpu, paper, fast = (parse_params(profiles.apply(raw, name)) for name in ("gpu", "paper", "paper-gpu"))
    short, full = run_config(gpu, "capsnet_r3_recon", 0), run_config(paper, "capsnet_r3_recon", 0)
    assert (short.epochs, short.lr_schedule_epochs, full.epochs, full.lr_schedule_epochs) == (50, 640, 640, 0)
    steps = 60_000 // 128  # per epoch
    end_short, end_full = _lr_lambda(short)(50 * steps), _lr_lambda(full)(640 * steps)
    assert end_short == pytest.approx(end_full) and 1e-3 * end_full == pytest.approx(2.2e-6, rel=0.02)
    assert 1e-3 * _lr_lambda(dataclasses.replace(short, lr_schedule_epochs=0))(50 * steps) == pytest.approx(6.2e-4, rel=0.01)
    assert _lr_lambda(short)(25 * steps) == pytest.approx(_lr_lambda(full)(320 * steps))  # halfway is halfway
    ft = fast.train
    assert (ft.epochs, ft.lr_schedule_epochs, ft.compile, ft.compile_cnns, ft.amp, ft.device) == (640, 0, True, False, False, "cuda")
    assert fast.prepare.multimnist_pairs_per_digit == 1000 and fast.ablation.seeds == paper.ablation.seeds


def test_gpu_profile_compiles_capsnets_and_runs_cnns_eager():
    from pipeline.training.config import run_config

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    gpu, paper = parse_params(profiles.apply(raw, "gpu")), parse_params(raw)
    compiled = {v: run_config(gpu, v, 0).compile for v in gpu.ablation.variants}
    models = {v: gpu.variant(v).model for v in gpu.ablation.variants}
    assert {v for v, c in compiled.items() if c} == {v for v, m in models.items() if m == "capsnet"}
    assert {"baseline_cnn", "cnn_affnist", "multimnist_baseline"} <= {v for v, c in compiled.items() if not c}
    both = parse_params(profiles.apply(raw, "gpu") | {"train": {**raw["train"], "compile": True}})
    assert all(run_config(both, v, 0).compile for v in both.ablation.variants)  # compile_cnns: true compiles all
    assert not any(run_config(paper, v, 0).compile for v in paper.ablation.variants)  # compile: false wins


def test_the_precision_twin_trains_in_fp32_beside_the_gpu_and_smoke_profiles_bf16_original():
    """#36 item 6: the gpu profile (bf16 autocast) and the smoke profile train capsnet_r3_recon_fp32,
    its fp32 twin (TF32 off), the paper profiles do not (their fp32 would repeat capsnet_r3_recon);
    `dvc exp run -S` gets the whole stacked list, the twin added once."""
    from pipeline.training.config import run_config

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    for name in ("gpu", "smoke"):
        p = parse_params(profiles.apply(raw, name))
        assert p.ablation.stacked == (*raw["ablation"]["stacked"], "capsnet_r3_recon_fp32")
        twin, original = run_config(p, "capsnet_r3_recon_fp32", 0), run_config(p, "capsnet_r3_recon", 0)
        assert not twin.amp and not twin.tf32 and original.amp == (name == "gpu")
        assert dataclasses.replace(twin, variant="", amp=original.amp) == dataclasses.replace(original, variant="")
        args = profiles.dvc_set_args(name, raw)
        stacked = args[args.index(next(a for a in args if a.startswith("ablation.stacked=")))]
        assert yaml.safe_load(stacked.split("=", 1)[1]) == list(p.ablation.stacked)
    twice = profiles.apply(profiles.apply(raw, "gpu"), "gpu")["ablation"]["stacked"]
    assert twice.count("capsnet_r3_recon_fp32") == 1
    cut = {**raw, "ablation": {**raw["ablation"], "stacked": ["capsnet_r1"], "separate": ["baseline_cnn"]}}
    assert profiles.apply(cut, "smoke")["ablation"]["stacked"] == ["capsnet_r1"]  # no original, no twin
    for name in ("paper", "paper-gpu"):
        assert "capsnet_r3_recon_fp32" not in parse_params(profiles.apply(raw, name)).ablation.variants


def test_unknown_key_or_profile_is_named():
    with pytest.raises(KeyError, match="train.nonsense is not a setting"):
        profiles.PROFILES["bad"] = {"train.nonsense": 1}
        try:
            profiles.apply({"train": {}}, "bad")
        finally:
            del profiles.PROFILES["bad"]
    with pytest.raises(KeyError, match="unknown profile 'fast'"):
        profiles.apply({}, "fast")


def test_a_setting_over_a_profile_must_be_one_of_params_yaml(tmp_path):
    """`--write … --set KEY=VALUE` (a GPU window's paper protocol in bf16): the value read as YAML over the
    profile's; a key params.yaml does not have, a section, or a setting without a value is refused in one line."""
    out = tmp_path / "p.yaml"
    run = [sys.executable, "-m", "pipeline.profiles", "paper-gpu", "--params", str(REPO / "params.yaml"), "--write", str(out)]
    subprocess.run([*run, "--set", "train.amp=true", "--set", "train.checkpoint_every=7"], check=True, cwd=REPO)
    written = parse_params(yaml.safe_load(out.read_text()))
    assert (written.base.profile, written.train.amp, written.train.checkpoint_every, written.train.epochs) == ("paper-gpu", True, 7, 640)
    assert "then train.amp=true, train.checkpoint_every=7" in out.read_text().splitlines()[0]
    for bad, said in (("train.ampp=true", "train.ampp is not a setting of params.yaml"), ("train=1", "train is not a setting"),
                      ("train.amp", "write it as KEY=VALUE")):
        refused = subprocess.run([*run, "--set", bad], cwd=REPO, capture_output=True, text=True)
        assert refused.returncode == 2 and said in refused.stderr.splitlines()[-1], refused.stderr


def test_dvc_arguments_and_written_file(tmp_path):
    args = profiles.dvc_set_args("smoke", yaml.safe_load((REPO / "params.yaml").read_text()))
    assert args[:2] == ["-S", "base.profile=smoke"] and "ablation.seeds=[0, 1]" in args and "train.device=cpu" in args
    out = tmp_path / "p.yaml"
    write_profile(out)
    assert parse_params(yaml.safe_load(out.read_text())).base.profile == "gpu"


def smoke_workspace():
    return profiles.apply(yaml.safe_load((REPO / "params.yaml").read_text()), "smoke")


def test_leftover_values_of_another_profile_are_named():
    committed = yaml.safe_load((REPO / "params.yaml").read_text())
    foreign = profiles.foreign_keys(smoke_workspace(), committed, "gpu")
    assert "prepare.train_subset" in foreign and "train.batch_size" in foreign and "ablation.seeds" in foreign
    assert foreign["train.batch_size"] == (16, 128)
    assert "train.epochs" not in foreign and "train.device" not in foreign  # the gpu profile sets these itself
    assert profiles.foreign_keys(committed, committed, "paper") == {}


def test_check_refuses_a_workspace_that_mixes_profiles(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], check=True)
    subprocess.run([*git, "add", "params.yaml"], check=True)
    subprocess.run([*git, "commit", "-qm", "p"], check=True)
    monkeypatch.setattr(profiles, "_cuda_available", lambda: True)
    profiles.check("gpu")  # as committed: fine
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(smoke_workspace()))
    with pytest.raises(SystemExit, match=r"train.batch_size = 16 \(committed: 128\).*git checkout params.yaml dvc.lock"):
        profiles.check("paper")
    with pytest.raises(SystemExit, match=f"prepare.train_subset = {profiles.PROFILES['smoke']['prepare.train_subset']} "):
        profiles.check("gpu")


def test_a_cuda_profile_without_cuda_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    """`make gpu` / `make paper-gpu` where torch sees no GPU: refused at the check, in one line naming
    the profile and what runs here instead, not minutes later at the first train stage; the paper
    profile (train.device auto) only warns, with its CPU estimate."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    monkeypatch.setattr(profiles, "_cuda_available", lambda: False)
    ran = tmp_path / "ran"
    for name in ("gpu", "paper-gpu"):
        with pytest.raises(SystemExit, match=f"the {name} profile trains on CUDA .* `make smoke` runs"):
            profiles.main([name, "--exec", "touch", str(ran)])
        assert not ran.exists()
    assert profiles.check("paper")[0].startswith("warning: no CUDA device; the paper profile would train")


def test_smoke_puts_params_and_lock_back_even_when_it_fails(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("a: 1\n")
    (tmp_path / "dvc.lock").write_text("lock\n")
    command = [sys.executable, "-c", "import pathlib, sys; pathlib.Path('params.yaml').write_text('a: 2'); "
               "pathlib.Path('dvc.lock').write_text('other'); sys.exit(3)"]
    assert profiles.run_restoring(command) == 3
    assert (tmp_path / "params.yaml").read_text() == "a: 1\n" and (tmp_path / "dvc.lock").read_text() == "lock\n"


def test_smoke_sets_its_report_aside_and_puts_the_published_one_back(tmp_path, monkeypatch):
    """README's set-up runs `make smoke`, then `make test`: the smoke's report stage rewrites reports/,
    and the published report (what tests/test_published.py and the README block check) must be there
    afterwards as committed, new files gone; the smoke's own report is in smoke-report/, figures with it."""
    monkeypatch.chdir(tmp_path)
    published = {"ablation.md": "published\n", "figures/table1.png": "png", "figures/montage.png": "same",
                 "runs/r1/config.json": "{}", "metrics/capsnet_r1.json": "{\"error_pct\": 0.4}"}
    for name, text in published.items():
        (tmp_path / "reports" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "reports" / name).write_text(text)
    smoke = ("import pathlib; r = pathlib.Path('reports'); (r / 'ablation.md').write_text('smoke\\n'); "
             "(r / 'figures/table1.png').write_text('smoke png'); (r / 'metrics/capsnet_r1.json').unlink(); "
             "(r / 'metrics/new.json').write_text('{}'); (r / 'plots').mkdir(); (r / 'plots/p.csv').write_text('x')")
    assert profiles.run_restoring([sys.executable, "-c", smoke]) == 0
    assert {str(p.relative_to(tmp_path / "reports")): p.read_text() for p in (tmp_path / "reports").rglob("*")
            if p.is_file()} == published
    assert not (tmp_path / "reports" / "plots").exists()
    aside = tmp_path / "smoke-report"
    assert (aside / "ablation.md").read_text() == "smoke\n" and (aside / "figures/table1.png").read_text() == "smoke png"
    assert (aside / "figures/montage.png").read_text() == "same"  # the report's links hold
    assert (aside / "metrics/new.json").is_file() and not (aside / "metrics/capsnet_r1.json").exists()
    assert not (aside / "runs").exists()  # published records the smoke never touched are not copied

def test_cpu_estimate_arithmetic():
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["ablation"] = {"seeds": [0, 1], "stacked": ["capsnet_r1"], "separate": ["baseline_cnn"]}
    raw["train"]["epochs"] = 3
    raw["prepare"]["train_subset"] = 30_000
    # (600 + 5,900 s per full epoch) x half the data x 3 epochs x 2 seeds
    assert profiles.cpu_hours(raw) == pytest.approx((600 + 5900) * 0.5 * 3 * 2 / 3600)


def test_a_variant_never_measured_on_a_cpu_is_estimated_at_table_1s_capsnet():
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["ablation"] = {"seeds": [0], "stacked": ["multimnist_r1_recon"], "separate": []}  # MultiMNIST: not measured
    raw["train"]["epochs"], raw["prepare"]["train_subset"] = 1, 0
    assert profiles.cpu_hours(raw) == pytest.approx(600 / 3600)


def test_leftover_keys_are_named_by_their_whole_path_and_a_key_on_one_side_is_missing_on_the_other():
    assert profiles.flatten({"variants": {"capsnet_r1": {"model": "capsnet"}}, "a": 1}) == {
        "variants.capsnet_r1.model": "capsnet", "a": 1}
    committed = {"train": {"epochs": 640}, "variants": {"capsnet_r1": {"model": "capsnet"}}}
    workspace = {"train": {"epochs": 640, "extra": 1}, "variants": {"capsnet_r1": {}}}
    assert profiles.foreign_keys(workspace, committed, "paper") == {
        "train.extra": (1, "<missing>"), "variants.capsnet_r1.model": ("<missing>", "capsnet")}


def test_only_a_long_profile_on_a_cpu_warns_and_check_prints_the_warning_and_stops(tmp_path, monkeypatch, capsys):
    """The paper profile on a CPU warns with its variants, seeds and epochs (on stderr; `--check` then
    ends there); the smoke profile, minutes on a CPU by design, does not."""
    monkeypatch.chdir(tmp_path)  # no git here: nothing committed to compare with
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["ablation"]["seeds"] = [0, 1, 2, 3]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.setattr(profiles, "_cuda_available", lambda: False)
    [warning] = profiles.check("paper")
    assert f"would train {len(ablation_variants(raw))} variants x 4 seeds x 640 epochs" in warning
    assert profiles.check("smoke") == []
    assert profiles.main(["paper", "--check"]) is None
    out, err = capsys.readouterr()
    assert out == "" and err == warning + "\n"


@pytest.mark.parametrize("argv, said", [
    (["smoke", "--prefill", "0", "--exec", "true"], "--prefill SLOTS (≥ 1) goes with the smoke profile's --exec"),
    (["gpu", "--warm", "--exec", "true"], "--warm goes with the smoke profile's --exec"),
    (["smoke", "--warm", "--write", "p.yaml"], "--warm goes with the smoke profile's --exec"),
    (["paper", "--check", "--set", "train.amp=true"], "--set goes with --write"),
    (["smoke", "--set", "train.amp=true", "--exec", "true"], "--set goes with --write"),
    (["smoke", "--exec"], "--exec needs a command")])
def test_options_that_do_not_go_together_are_refused_in_one_line(tmp_path, monkeypatch, capsys, argv, said):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    monkeypatch.setattr(profiles, "run_restoring", lambda *a, **k: pytest.fail("ran"))
    with pytest.raises(SystemExit) as exited:
        profiles.main(argv)
    assert exited.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith(said)


def test_the_smokes_exec_hands_its_prefill_and_warm_flag_to_the_restoring_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    calls = []
    monkeypatch.setattr(profiles, "run_restoring", lambda command, **kw: calls.append((command, kw)) or 0)
    with pytest.raises(SystemExit) as exited:
        profiles.main(["smoke", "--prefill", "2", "--warm", "--exec", "dvc", "exp", "run"])
    [(command, kw)] = calls
    assert exited.value.code == 0 and command[:3] == ["dvc", "exp", "run"] and "base.profile=smoke" in command
    assert kw == {"prefill": (profiles.apply(raw, "smoke"), 2), "warm": True}


def test_a_failed_prefill_stops_before_the_command_with_its_params_in_order_and_a_label_per_slot(tmp_path, monkeypatch):
    """The prefill writes its params (keys in their order, as params.yaml has them), fans out with one
    label per slot and no finishing `dvc repro`; when it fails the command never runs, and params.yaml
    is put back."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("a: 1\n")
    seen = []

    def fake_run(command, env=None, **kwargs):
        seen.append((command, env, (tmp_path / "params.yaml").read_text()))
        return subprocess.CompletedProcess(command, 4)

    monkeypatch.setattr(profiles.subprocess, "run", fake_run)
    monkeypatch.setenv("X", "y")
    params = {"train": {"epochs": 1}, "ablation": {"seeds": [0]}}
    assert profiles.run_restoring(["dvc", "exp", "run"], ("params.yaml",), prefill=(params, 3)) == 4
    [(command, env, written)] = seen
    assert command == ["bash", "scripts/fanout.sh"] and (env["GPUS"], env["FANOUT_FINISH"], env["X"]) == ("cpu0 cpu1 cpu2", "0", "y")
    assert written == "train:\n  epochs: 1\nablation:\n  seeds:\n  - 0\n"
    assert (tmp_path / "params.yaml").read_text() == "a: 1\n"


def test_a_smoke_that_writes_no_report_sets_nothing_aside_and_one_that_deletes_sets_its_folder_aside(
        tmp_path, monkeypatch, capsys):
    """A smoke run that leaves reports/ alone says nothing about it and leaves smoke-report/ as it was;
    one that only deletes a file sets that file's folder aside without it, in a smoke-report/ emptied of
    the last smoke's files first."""
    monkeypatch.chdir(tmp_path)
    for name in ("figures/keep.png", "figures/old.png", "ablation.md"):
        (tmp_path / "reports" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "reports" / name).write_text(name)
    (tmp_path / "smoke-report").mkdir()
    (tmp_path / "smoke-report" / "stale.md").write_text("an earlier smoke's")
    assert profiles.run_restoring([sys.executable, "-c", "pass"], paths=()) == 0
    assert "restored reports/" not in capsys.readouterr().err and (tmp_path / "smoke-report" / "stale.md").is_file()
    assert profiles.run_restoring([sys.executable, "-c", "import os; os.remove('reports/figures/old.png')"], paths=()) == 0
    assert (tmp_path / "reports" / "figures" / "old.png").read_text() == "figures/old.png"
    assert sorted(str(p.relative_to(tmp_path / "smoke-report")) for p in (tmp_path / "smoke-report").rglob("*")
                  if p.is_file()) == ["figures/keep.png"]


def test_gpu_session_writes_only_git_ignored_paths():
    """The device tool re-sends the working tree each call and deletes there what git does not
    ignore: a run output of scripts/gpu_session.sh or gpu_plan.sh outside .gitignore (results/**/metrics.json was)
    vanishes between calls of one session."""
    script = (REPO / "scripts" / "gpu_session.sh").read_text() + (REPO / "scripts" / "gpu_plan.sh").read_text()
    written = ["models/v/seed0/model.safetensors", "checkpoints/v/seed0.pt", "gpu_results/v/seed0/metrics.json",
               "logs/bench/v@bf16-graphs.jsonl", "journal/run.jsonl", "logs/v-0.log", "params.gpu.yaml",
               "params.gpu.$key.yaml", "logs/gpu_tests.txt", "fingerprints/0953adc.json", "params.paper-gpu.yaml",
               "logs/tests.kept",
               "data/prepared/train.safetensors"]
    for path in written:
        assert path.split("/")[0] in script, path
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=REPO, capture_output=True,
                             text=True).stdout.split()
    assert ignored == written
    assert '"results/$variant' not in script  # evaluate never writes into the committed results/ tree


def test_gpu_queue_skips_what_is_published_under_the_profiles_protocol(tmp_path):
    """scripts/gpu_queue.py: runs of the gpu profile's protocol are done, wherever their record is
    published (models/, or set aside under earlier/ by a later run of the same seed); runs of an older
    protocol (the published ones, cut at 50 epochs of the uncompressed schedule) are queued again;
    the fp32 twin counts only its fp32 records; Table 1's rows (seed by seed) come before MultiMNIST,
    the precision check's twin and §5.2."""
    import json

    from pipeline.core import protocol
    from pipeline.report import publish
    from pipeline.training.config import run_config

    gpu_queue = script("gpu_queue")
    assert gpu_queue.EARLIER == publish.EARLIER
    params = write_profile(tmp_path / "params.gpu.yaml")
    raw = yaml.safe_load(params.read_text())
    gpu = parse_params(raw)
    runs = tmp_path / "runs"

    def record(where: str, variant: str, seed: int, **changed) -> None:  # a config.json as the train stage writes it
        cfg = {k: v for k, v in dataclasses.asdict(run_config(gpu, variant, seed)).items() if v is not None}
        config = {"config": {**cfg, **changed}, "params": {"device": "cuda"}}
        folder = runs / where / variant / f"seed{seed}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(config))

    record("models", "capsnet_r3_recon", 0)
    record("earlier/run1/models", "capsnet_r1", 2)  # set aside by a later run of another protocol
    record("models", "capsnet_r1", 2, epochs=640)
    record("models", "capsnet_r3_recon", 1, lr_schedule_epochs=0)  # the old, cut schedule
    record("models", "capsnet_r3_recon_fp32", 0)
    record("models", "capsnet_r3_recon_fp32", 1, amp=True)  # not the twin's precision
    assert protocol.planned(raw, "capsnet_r3_recon_fp32")[-1] == "fp32"
    assert protocol.planned(raw, "capsnet_r3_recon")[-1] == "bf16 autocast"
    items = gpu_queue.queue(runs, raw)
    assert len(items) == 15 * 3 - 3
    assert not {"capsnet_r3_recon:0", "capsnet_r1:2", "capsnet_r3_recon_fp32:0"} & set(items)
    assert items[0] == "capsnet_r3_recon_official:0" and items[8] == "capsnet_r3_recon:1"  # the old protocol: again
    assert items.index("baseline_cnn:2") < items.index("multimnist_r3_recon:0") < items.index("capsnet_r3_recon_fp32:1") \
        < items.index("capsnet_affnist:0")
    published = subprocess.run([sys.executable, "scripts/gpu_queue.py", "--params", str(params), "--limit", "3",
                                "--runs", str(runs)], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert published == items[:3] == ["capsnet_r3_recon_official:0", "capsnet_r1_recon:0", "capsnet_r1_recon_official:0"]
    stacked = gpu_queue.stacked(items)  # one item per variant, its missing seeds in one process
    assert stacked[:2] == ["capsnet_r3_recon_official:0,1,2", "capsnet_r1_recon:0,1,2"]
    assert "capsnet_r3_recon:1,2" in stacked and "capsnet_r1:0,1" in stacked and "capsnet_r3_recon_fp32:1,2" in stacked
    assert len(stacked) == 15

    # with the fingerprint table of the code that trains (gpu_plan.sh writes it first): a record of other
    # training code, or of the same digits in another environment, is queued again; one without a
    # fingerprint (it predates them) keeps counting by its protocol
    env = "torch 2.11.0+cu130, CPU AVX2 capped"
    table = {"commit": "c0ffee" * 6 + "0123", "environment": env,
             "fingerprints": {"capsnet_r3_recon": "a" * 16, "capsnet_r1": "b" * 16, "capsnet_r1_recon": "c" * 16}}
    (tmp_path / "table.json").write_text(json.dumps(table))

    def fingerprinted(where: str, variant: str, seed: int, fingerprint: str, environment: str = env) -> None:
        path = runs / where / variant / f"seed{seed}" / "config.json"
        if not path.is_file():
            record(where, variant, seed)
        path.write_text(json.dumps(json.loads(path.read_text()) | {
            "training_fingerprint": fingerprint, "environment": {"fingerprint_environment": environment}}))

    fingerprinted("models", "capsnet_r3_recon", 0, "a" * 16)  # this code's training
    fingerprinted("earlier/run1/models", "capsnet_r1", 2, "f" * 16)  # other training code
    fingerprinted("models", "capsnet_r1_recon", 0, "c" * 16, "torch 2.11.0+cu130, CPU AVX512")  # an uncapped one
    assert gpu_queue.queue(runs, raw) == [i for i in items if i != "capsnet_r1_recon:0"]  # no table: not checked
    checked = gpu_queue.queue(runs, raw, table)
    assert set(checked) == set(items) | {"capsnet_r1:2"} and len(checked) == len(items) + 1
    assert "capsnet_r3_recon_fp32:0" not in checked  # no fingerprint recorded: its protocol decides
    assert gpu_queue.other_training(runs, raw, table) == ["capsnet_r1_recon:0", "capsnet_r1:2"]
    done = subprocess.run([sys.executable, "scripts/gpu_queue.py", "--params", str(params), "--runs", str(runs),
                           "--fingerprints", str(tmp_path / "table.json")], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.split() == checked
    assert done.stderr.strip() == f"queued again, published under this protocol by other training code than c0ffeec's ({env}): " \
        "capsnet_r1_recon:0 capsnet_r1:2"
    # the uncapped record carries over where tables of its own commit say what it trained: that commit's
    # table in the record's environment holds what it recorded, its table in the window's environment what
    # the window's table holds (pipeline.core.lineage; scripts/fingerprint_at.py writes the latter)
    path = runs / "models" / "capsnet_r1_recon" / "seed0" / "config.json"
    config = json.loads(path.read_text())
    config["environment"]["git_commit"] = "d" * 40
    path.write_text(json.dumps(config))
    (runs / "fingerprints").mkdir()
    own = {"commit": "d" * 40, "environment": "torch 2.11.0+cu130, CPU AVX512", "fingerprints": {"capsnet_r1_recon": "c" * 16}}
    (runs / "fingerprints" / "there.json").write_text(json.dumps(own | {"environment": env}))
    (runs / "fingerprints" / "own.json").write_text(json.dumps(own | {"fingerprints": {"capsnet_r1_recon": "e" * 16}}))
    assert gpu_queue.other_training(runs, raw, table) == ["capsnet_r1_recon:0", "capsnet_r1:2"]  # its commit computed "e…" there
    (runs / "fingerprints" / "own.json").write_text(json.dumps(own))
    assert gpu_queue.other_training(runs, raw, table) == ["capsnet_r1:2"]
    assert "capsnet_r1_recon:0" not in gpu_queue.queue(runs, raw, table)
    assert gpu_queue.bridges(runs, raw, table) == []  # every record known in the window's environment
    (runs / "fingerprints" / "there.json").unlink()  # the commit's code not computed in the window's environment
    assert gpu_queue.other_training(runs, raw, table) == ["capsnet_r1_recon:0", "capsnet_r1:2"]
    # so the window computes that table on its own host (gpu_plan.sh): the commits whose table there would
    # carry a record, each with the variants it needs, the commit with the most records first; a record
    # its own commit's table does not vouch for, or one known there already, asks for none
    for seed in (0, 1):
        fingerprinted("models", "capsnet_r3", seed, "9" * 16, "torch 2.11.0+cu130, CPU AVX512")
        path = runs / "models" / "capsnet_r3" / f"seed{seed}" / "config.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | {
            "environment": {"fingerprint_environment": "torch 2.11.0+cu130, CPU AVX512", "git_commit": "e" * 40}}))
    (runs / "fingerprints" / "e.json").write_text(json.dumps(own | {"commit": "e" * 40, "fingerprints": {"capsnet_r3": "9" * 16}}))
    assert gpu_queue.bridges(runs, raw, table) == [("e" * 40, ["capsnet_r3"]), ("d" * 40, ["capsnet_r1_recon"])]
    asked = subprocess.run([sys.executable, "scripts/gpu_queue.py", "--params", str(params), "--runs", str(runs), "--bridges",
                            "--fingerprints", str(tmp_path / "table.json")], cwd=REPO, capture_output=True, text=True, check=True)
    assert asked.stdout.splitlines() == [f"{'e' * 40} capsnet_r3", f"{'d' * 40} capsnet_r1_recon"]
    (runs / "fingerprints" / "own.json").write_text(json.dumps(own | {"fingerprints": {"capsnet_r1_recon": "e" * 16}}))
    assert gpu_queue.bridges(runs, raw, table) == [("e" * 40, ["capsnet_r3"])]  # d's table does not vouch for it
    beside = {"commit": "e" * 40, "environment": env, "fingerprints": {"capsnet_r3": "b" * 16}}
    assert gpu_queue.bridges(runs, raw, table, [beside]) == []  # the window's own table of e, beside its table
    absent = subprocess.run([sys.executable, "scripts/gpu_queue.py", "--params", str(params), "--fingerprints",
                             str(tmp_path / "none.json")], cwd=REPO, capture_output=True, text=True)
    assert absent.returncode == 1 and "capsnet fingerprint" in absent.stderr and "none.json does not exist" in absent.stderr


def test_the_gpu_scripts_call_capsnet_with_options_it_has():
    """The GPU session runs where no test runs before it: every `capsnet` command its scripts call,
    and every option they pass, must exist (a renamed option fails there, in the GPU's minutes)."""
    import re

    from pipeline.cli import main

    calls = []
    for shell in ("gpu_session.sh", "gpu_plan.sh", "gpu_import.sh"):
        text = (REPO / "scripts" / shell).read_text().replace("\\\n", " ")
        for line in text.splitlines():
            for m in re.finditer(r'(?:\$CLI|pipeline\.cli|capsnet)\s+([a-z][\w-]*)([^|;&]*)', line):
                calls.append((shell, m.group(1), re.findall(r"(--[a-z][\w-]*)", m.group(2))))
    assert any(command == "prepare" for _, command, _ in calls)  # the scan sees the calls
    for shell, command, options in calls:
        if command not in main.commands:
            continue  # `capsnet` in prose, or another program's word
        known = {o for p in main.commands[command].params for o in p.opts}
        assert set(options) <= known, f"{shell}: capsnet {command} has no {sorted(set(options) - known)}"


def test_gpu_levers_picks_the_fastest_mode_its_cuda_tests_prove(tmp_path):
    """scripts/gpu_levers.py (gpu_session.sh --levers): per benched model, the fastest bench row of
    three stacked seeds whose mode every proving CUDA test passed; a faster mode no CUDA test proves
    (compile's own CUDA graphs), a captured mode the bench ran uncaptured, and a mode whose test
    failed are passed over; the written params file is the profile's with those levers and loads."""
    import json

    from pipeline.core.params import load_params

    params = write_profile(tmp_path / "params.gpu.yaml")

    def row(variant, mode, rate, seeds=3, stack="fused", **more):
        return {"variant": variant, "mode": mode, "seeds": seeds, "train_images_per_s": rate,
                **({"stack": stack} if seeds > 1 else {}), **more}

    rows = [row("capsnet_r3_recon", "bf16-compile", 60_000), row("capsnet_r3_recon", "bf16-compile", 90_000, seeds=1),
            row("capsnet_r3_recon", "bf16-compile-capture", 150_000, stack="bmm", captured=True),
            row("capsnet_r3_recon", "bf16-compile-capture", 120_000, captured=True),
            row("capsnet_r3_recon", "bf16-graphs", 400_000),  # faster, but no CUDA test proves it
            row("capsnet_r3_recon", "bf16-capture", 300_000, captured=False),  # fell back uncaptured
            row("baseline_cnn", "bf16", 30_000), row("baseline_cnn", "bf16-capture", 50_000, captured=True)]
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    capture = "tests/test_capture_gpu.py::test_the_captured_step_replays_what_the_eager_step_computes"
    log = "\n".join([
        "tests/test_gpu.py::test_bf16_compiled_step_matches_eager_fp32[capsnet_r3_recon] PASSED [ 1%]",
        "tests/test_gpu.py::test_compiled_bf16_stacked_training_steps_stay_finite[capsnet_r3_recon] PASSED [ 2%]",
        f"{capture}[capsnet_r3_recon-bf16-compiled-fused-3seed] PASSED [ 3%]",
        f"{capture}[capsnet_r3_recon-bf16-compiled-fused-1seed] PASSED [ 4%]",
        f"[gw3] [  5%] PASSED {capture}[capsnet_r3_recon-bf16-eager-fused-3seed] ",  # pytest-xdist's -n
        f"[gw1] [  6%] FAILED {capture}[baseline_cnn-bf16-eager-fused-3seed] ",
        f"FAILED {capture}[baseline_cnn-bf16-eager-fused-3seed] - AssertionError: grads"])
    (tmp_path / "tests.txt").write_text(log)

    def levers():
        out = subprocess.run([sys.executable, "scripts/gpu_levers.py", "--bench", str(tmp_path / "bench"), "--tests",
                              str(tmp_path / "tests.txt"), "--params", str(params)],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout
        return out, tmp_path / "params.gpu.capsnet.yaml", tmp_path / "params.gpu.baseline_cnn.yaml"

    out, capsnet, cnn = levers()
    assert "capsnet: bf16-compile-capture, stack bmm: 150,000 images/s" in out and "profile's bf16-compile-capture: 120,000" in out
    assert "baseline_cnn: bf16, stack fused: 30,000" in out and cnn.exists()
    chosen = load_params(capsnet).train
    assert (chosen.cuda_graph, chosen.compile, chosen.stack_layout, chosen.amp, chosen.epochs) == (True, True, "bmm",
                                                                                               True, 50)
    assert load_params(cnn).train.cuda_graph is False  # its capture test failed: the profile's eager bf16 wins
    # one seed faster than any proven stack (the H200: 66k alone, 31.6k three stacked): the window trains
    # seed by seed, so the one-seed rows compete, the faster bf16-compile (graphs) still unproven
    alone = [*rows, row("capsnet_r3_recon", "bf16-compile-capture", 200_000, seeds=1, captured=True),
             row("capsnet_r3_recon", "bf16-graphs", 500_000, seeds=1)]
    (tmp_path / "bench" / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in alone) + "\n")
    out, capsnet, _ = levers()
    assert "capsnet: bf16-compile-capture, stack fused: 200,000 images/s (capsnet_r3_recon, 1 seed;" in out
    (tmp_path / "bench" / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "tests.txt").write_text(log.replace("PASSED", "FAILED"))
    out, capsnet, _ = levers()
    # nothing proven, the profile's own compiled and captured step neither: eager bf16 (issue #36, item 1)
    assert "no bench mode of capsnet_r3_recon passed its CUDA tests" in out
    assert "the profile's bf16-compile-capture is not proven either" in out and "capsnet: bf16, " not in out
    chosen = load_params(capsnet).train
    assert (chosen.compile, chosen.cuda_graph, chosen.channels_last, chosen.amp) == (False, False, False, True)
    # where the profile's own mode is proven, it stays (no file), even with no other row to choose from
    (tmp_path / "bench" / "rows.jsonl").write_text(json.dumps(row("capsnet_r3_recon", "bf16-graphs", 400_000)) + "\n")
    (tmp_path / "tests.txt").write_text(log)
    out, capsnet, _ = levers()
    assert "the profile's bf16-compile-capture stays" in out and not capsnet.exists()


def test_the_fp32_twin_trains_with_the_fastest_fp32_mode_its_cuda_tests_prove(tmp_path):
    """gpu_levers for the precision check (#36 item 6): capsnet_r3_recon_fp32 reads its own levers file
    (`--key`: capsnet-fp32), chosen among fp32 rows only (a faster bf16 row is another precision, never a
    lever); its compiled captured step needs its fp32 CUDA tests, else eager fp32; a run recorded in that
    mode is checked against them (gpu_session.sh's proofs); the estimate prices the twin at the fp32 row."""
    import json

    from pipeline.core.params import load_params
    from pipeline.training.config import run_config

    params = write_profile(tmp_path / "params.gpu.yaml")
    gpu_levers, gpu_queue = script("gpu_levers"), script("gpu_queue")

    def key(variant):
        return subprocess.run([sys.executable, "scripts/gpu_levers.py", "--params", str(params), "--key", variant],
                              cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()

    assert (key("capsnet_r3_recon_fp32"), key("capsnet_r3_recon"), key("baseline_cnn")) == ("capsnet-fp32", "capsnet",
                                                                                         "baseline_cnn")
    rows = [{"variant": "capsnet_r3_recon", "mode": mode, "seeds": 1, "train_images_per_s": rate, "captured": True}
            for mode, rate in [("bf16-compile-capture", 66_000), ("fp32", 15_000), ("compile-capture", 30_000),
                               ("capture", 20_000)]]
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    capture = "tests/test_capture_gpu.py::test_the_captured_step_replays_what_the_eager_step_computes"
    proofs = [f"{capture}[capsnet_r3_recon-fp32-compiled-fused-1seed]",
              "tests/test_gpu.py::test_compiled_fp32_step_matches_eager_fp32[capsnet_r3_recon]",
              f"{capture}[capsnet_r3_recon-fp32-eager-fused-3seed]"]

    def levers(outcome):
        (tmp_path / "tests.txt").write_text("\n".join(f"{t} {outcome} [ 1%]" for t in proofs))
        out = subprocess.run([sys.executable, "scripts/gpu_levers.py", "--bench", str(tmp_path / "bench"), "--tests",
                              str(tmp_path / "tests.txt"), "--params", str(params)],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout
        return out, load_params(tmp_path / "params.gpu.capsnet-fp32.yaml")

    out, twin = levers("PASSED")
    assert "capsnet-fp32 (fp32 twin) — capsnet: compile-capture, stack fused: 30,000 images/s" in out
    assert (twin.train.compile, twin.train.cuda_graph, twin.train.amp) == (True, True, True)  # amp: the profile's
    assert run_config(twin, "capsnet_r3_recon_fp32", 0).amp is False  # the twin's own precision still wins

    recorded = {"config": {"model": "capsnet", "amp": False, "compile": True, "compile_mode": "default",
                           "channels_last": False, "cuda_graph": True}}
    passed = gpu_levers.test_outcomes((tmp_path / "tests.txt").read_text())
    assert gpu_levers.run_unproven(recorded, passed) == ""
    raw = yaml.safe_load((tmp_path / "params.gpu.capsnet-fp32.yaml").read_text())
    assert gpu_queue.trained_rows(raw, "capsnet_r3_recon_fp32", rows)[1] == [rows[2]]  # priced at the fp32 row
    assert gpu_queue.trained_rows(raw, "capsnet_r3_recon", rows)[1] == [rows[0]]  # the same levers, in bf16
    out, twin = levers("FAILED")
    assert "capsnet-fp32 (fp32 twin) — capsnet: fp32, stack fused: 15,000 images/s" in out
    assert (twin.train.compile, twin.train.cuda_graph) == (False, False)  # eager fp32
    assert "FAILED" in gpu_levers.run_unproven(recorded, gpu_levers.test_outcomes((tmp_path / "tests.txt").read_text()))


def test_gpu_levers_count_only_a_passed_proof_and_write_what_each_choice_trains_with(tmp_path):
    """scripts/gpu_levers.py: a proving CUDA test that was skipped proves nothing (a streams row refused, and
    counted among the modes not proven); pytest-xdist's lines count; a CNN given a compiled mode compiles
    (compile_cnns); the fp32 twin never takes a bf16 row, and with no fp32 row falls back to eager fp32 in
    the fused layout, whatever layout the profile stacks in; --check-run fails a run whose settings no
    passed test proves, naming it, and a missing params file is one line naming the command that writes it."""
    import json

    from pipeline.core.params import load_params

    params = write_profile(tmp_path / "params.gpu.yaml")
    raw = yaml.safe_load(params.read_text())
    raw["train"]["stack_layout"] = "streams"
    params.write_text(yaml.safe_dump(raw, sort_keys=False))

    def row(variant, mode, rate, seeds=3, stack="fused"):
        return {"variant": variant, "mode": mode, "seeds": seeds, "train_images_per_s": rate, "captured": True,
                **({"stack": stack} if seeds > 1 else {})}

    rows = [row("capsnet_r3_recon", "bf16-compile-capture", 150_000, stack="streams"),
            row("capsnet_r3_recon", "bf16-compile", 60_000), row("capsnet_r3_recon", "bf16-cl", 10_000, seeds=1),
            row("baseline_cnn", "bf16-compile", 80_000), row("baseline_cnn", "bf16", 30_000)]
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    capture = "tests/test_capture_gpu.py::test_the_captured_step_replays_what_the_eager_step_computes"
    (tmp_path / "tests.txt").write_text("\n".join([
        "[gw0] [ 1%] PASSED tests/test_gpu.py::test_bf16_compiled_step_matches_eager_fp32[capsnet_r3_recon]",
        "[gw1] [ 2%] PASSED tests/test_gpu.py::test_compiled_bf16_stacked_training_steps_stay_finite[capsnet_r3_recon]",
        "tests/test_gpu.py::test_bf16_compiled_step_matches_eager_fp32[baseline_cnn] PASSED [ 3%]",
        "tests/test_gpu.py::test_compiled_bf16_stacked_training_steps_stay_finite[baseline_cnn] PASSED [ 4%]",
        f"{capture}[capsnet_r3_recon-bf16-compiled-fused-3seed] PASSED [ 5%]",
        f"{capture}[capsnet_r3_recon-bf16-compiled-streams-3seed] SKIPPED [ 6%]"]))

    def levers(*args):
        return subprocess.run([sys.executable, "scripts/gpu_levers.py", "--tests", str(tmp_path / "tests.txt"), *args],
                              cwd=REPO, capture_output=True, text=True)

    out = levers("--bench", str(tmp_path / "bench"), "--params", str(params)).stdout
    assert "capsnet: bf16-compile, stack fused: 60,000 images/s (capsnet_r3_recon, 3 seeds; 1 mode(s) not proven" in out
    cnn = load_params(tmp_path / "params.gpu.baseline_cnn.yaml").train
    assert (cnn.compile, cnn.compile_cnns) == (True, True)  # the CNN trains the compiled mode it was picked for
    twin = load_params(tmp_path / "params.gpu.capsnet-fp32.yaml").train
    assert (twin.compile, twin.cuda_graph, twin.stack_layout) == (False, False, "fused")
    assert "capsnet-fp32 (fp32 twin) — " in out and out.split("capsnet-fp32 (fp32 twin) — ")[1].split("\n")[0].endswith(
        ": fp32, eager")  # its own precision's eager mode
    captured = {"model": "capsnet", "amp": True, "compile": True, "compile_mode": "default", "channels_last": False,
                "cuda_graph": True, "stack_layout": "streams"}
    streams = {"config": captured, "stacked_seeds": [0, 1, 2]}
    (tmp_path / "run.json").write_text(json.dumps(streams))
    refused = levers("--check-run", str(tmp_path / "run.json"))
    assert refused.returncode == 1 and refused.stderr.strip().endswith("-streams-3seed] SKIPPED")
    fused = {**captured, "cuda_graph": False, "stack_layout": "fused"}
    (tmp_path / "run.json").write_text(json.dumps({**streams, "config": fused}))
    assert levers("--check-run", str(tmp_path / "run.json")).returncode == 0
    missing = tmp_path / "absent.yaml"
    absent = levers("--params", str(missing))
    assert absent.returncode == 1
    writes = f"python -m pipeline.profiles gpu --write {missing}"
    assert absent.stderr == f"{missing} does not exist: write it with `{writes}`\n"


def test_gpu_levers_write_a_channels_last_pick_and_read_no_row_of_another_seed_count(tmp_path):
    """scripts/gpu_levers.py: a channels-last mode picked is written as channels_last; rows of a seed count
    the window never trains in one process (two) neither compete nor stop the choice (a model with only
    those falls back, no traceback); a proof reported failed and then passed (two logs, one file) is failed."""
    import json

    from pipeline.core.params import load_params

    params = write_profile(tmp_path / "params.gpu.yaml")
    rows = [{"variant": "capsnet_r3_recon", "mode": "bf16-cl", "seeds": 3, "stack": "fused", "train_images_per_s": 100_000},
            {"variant": "capsnet_r3_recon", "mode": "bf16-compile", "seeds": 3, "stack": "fused", "train_images_per_s": 200_000},
            {"variant": "capsnet_r3_recon", "mode": "bf16-compile", "seeds": 2, "stack": "fused", "train_images_per_s": 900_000},
            {"variant": "baseline_cnn", "mode": "bf16", "seeds": 2, "stack": "fused", "train_images_per_s": 50_000}]
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    compiled = "tests/test_gpu.py::test_bf16_compiled_step_matches_eager_fp32[capsnet_r3_recon]"
    (tmp_path / "tests.txt").write_text("\n".join([
        "tests/test_gpu.py::test_bf16_channels_last_step_matches_eager_fp32[capsnet_r3_recon] PASSED [ 1%]",
        f"{compiled} FAILED [ 2%]",
        "tests/test_gpu.py::test_compiled_bf16_stacked_training_steps_stay_finite[capsnet_r3_recon] PASSED [ 3%]",
        f"[gw0] [ 50%] PASSED {compiled}"]))
    out = subprocess.run([sys.executable, "scripts/gpu_levers.py", "--bench", str(tmp_path / "bench"), "--tests",
                          str(tmp_path / "tests.txt"), "--params", str(params)],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "capsnet: bf16-cl, stack fused: 100,000 images/s (capsnet_r3_recon, 3 seeds; 1 mode(s) not proven" in out
    chosen = load_params(tmp_path / "params.gpu.capsnet.yaml").train
    assert (chosen.channels_last, chosen.compile, chosen.cuda_graph, chosen.amp) == (True, False, False, True)
    assert "baseline_cnn: no bench row of baseline_cnn in a proven mode at the profile's precision" in out


def test_the_queue_plans_the_protocol_the_train_stage_records_from_the_same_params(tmp_path):
    """pipeline.core.protocol: a params file that leaves base.profile, train.tf32 and the device to their
    defaults is planned (gpu_queue.py, a device left to auto counting as CUDA) as the protocol its run records
    on a GPU, cuda:N included; a record's device is the resolved one it wrote (params), not the config's
    `auto`; another base rate is another protocol, and a record without a profile says so. The precision
    check's rule: no interval end, no decision."""
    import dataclasses
    import math

    from pipeline.core import protocol
    from pipeline.core.params import load_params
    from pipeline.training.config import run_config

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["base"].pop("profile", None)
    raw["train"].pop("tf32", None)
    for amp in (False, True):
        raw["train"].update(device="auto", amp=amp)
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
        recorded = dataclasses.asdict(run_config(load_params(tmp_path / "params.yaml"), "capsnet_r1", 0))
        cfg = {k: v for k, v in recorded.items() if v is not None}  # as config.json records it
        for device in ("cuda", "cuda:1"):
            assert protocol.planned(raw, "capsnet_r1") == protocol.protocol_key(cfg, device)
    assert protocol.precision(cfg, "cuda:1") == "bf16 autocast"  # the last record's: amp on
    assert protocol.device_of({"config": {**cfg, "device": "auto"}, "params": {"device": "cuda"}}) == "cuda"
    assert protocol.protocol_key({**cfg, "lr": cfg["lr"] / 2}, "cuda") != protocol.protocol_key(cfg, "cuda")
    assert protocol.protocol_key({k: v for k, v in cfg.items() if k != "profile"}, "cuda")[0] == protocol.NOT_RECORDED
    # the precision check: undecided without either end of an interval, and an interval ending at 0 holds it
    assert protocol.bf16_allowed(math.nan, 0.2, 3) is None and protocol.bf16_allowed(-0.1, math.nan, 3) is None
    assert protocol.bf16_allowed(0.0, 0.2, 3) is True and protocol.bf16_allowed(-0.2, 0.0, 3) is True
