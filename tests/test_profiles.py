"""Profiles are params.yaml plus overrides defined once; every profile is a valid params file."""

import dataclasses
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, write_profile
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
