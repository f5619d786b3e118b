"""Where the training fingerprint is computed (pipeline.training.fingerprint): a capped process of this
checkout per variant, its environment (torch, the processor's cap, MKL's branch, the host), a commit's
fingerprint table, the probe that compares hosts' caps, and one line for each way a process fails. What
it computes and its pins: tests/test_fingerprint.py."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from pipeline.core.params import load_params
from pipeline.training import fingerprint as fp
from pipeline.training.config import run_config

from conftest import REPO, script, tiny_pipeline



def test_its_environment_names_the_branch_mkl_itself_reports():
    """MKL sets aside an MKL_CBWR branch the processor's vendor lacks and runs AUTO without a word (its
    AVX2 branch is Intel's only): the recorded environment says what MKL ran, not what was asked."""
    if not torch.backends.mkl.is_available():
        pytest.skip("this torch has no MKL")
    code = "from pipeline.training.fingerprint import mkl_branch; print(mkl_branch())"

    def branch(**env: str) -> str:
        base = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
        return subprocess.run([sys.executable, "-c", code], env=base | env, cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()

    assert (branch(MKL_CBWR="COMPATIBLE"), branch(MKL_CBWR="AUTO"), branch()) == ("COMPATIBLE", "AUTO", "OFF")


def test_an_earlier_commits_table_is_its_own_code_under_this_cap(tmp_path, params, monkeypatch):
    """scripts/fingerprint_at.py: a commit's code, checked out in a worktree of its own, computes under
    this checkout's cap what this checkout computes where training is the same, and the table names the
    commit and this environment, in a folder made for it; a name that is no commit gets one line, and so does a
    commit whose gpu profile or fingerprint process fails (its last line; no table, no worktree left)."""
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(REPO / "pipeline", repo / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "fingerprint_at.py", repo / "scripts")
    shutil.copy(REPO / "params.yaml", repo)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "the code"]):
        subprocess.run(git + args, check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    script = [sys.executable, str(repo / "scripts" / "fingerprint_at.py")]
    monkeypatch.setenv("CAPSNET_FINGERPRINT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "tables" / "table.json"  # its folder made
    subprocess.run(script + [head[:7], str(out), "--variants", "capsnet_r1"], check=True, capture_output=True,
                   text=True)
    kept = [json.loads(p.read_text())["fingerprints"] for p in (tmp_path / "cache").glob("*.json")]
    assert [1] == [len(f) for f in kept if f]  # capsnet_r1's, in the cache it was given, not the user's
    table = json.loads(out.read_text())
    assert table["commit"] == head and table["environment"] == fp.fingerprint_environment()
    assert table["fingerprints"] == {"capsnet_r1": fp.training_fingerprint(run_config(params, "capsnet_r1", 0))}
    assert table["computed"] == f"{head[:7]}'s code under {head[:7]}'s cap (scripts/fingerprint_at.py)"
    def worktrees() -> int:
        return subprocess.run(git + ["worktree", "list"], capture_output=True, text=True).stdout.count("\n")

    assert worktrees() == 1  # its own worktree removed
    none = subprocess.run(script + ["nosuch", str(tmp_path / "none.json")], capture_output=True, text=True)
    assert none.returncode == 1 and none.stderr.strip().splitlines() == [
        "nosuch is no commit of this repository: name one as `git log --oneline` shows it"]
    # a variant its params lack: its fingerprint process fails, and only its last line is said, nothing kept
    failed = subprocess.run(script + [head[:7], str(tmp_path / "no.json"), "--variants", "capsnet_r99"],
                            capture_output=True, text=True)
    assert failed.returncode == 1 and not (tmp_path / "no.json").exists()
    [line] = failed.stderr.strip().splitlines()
    assert line.startswith(f"{head[:7]}'s fingerprint table failed: ") and "capsnet_r99" in line
    for args in (["rm", "-q", "params.yaml"], ["commit", "-qm", "no params"]):
        subprocess.run(git + args, check=True)
    bare = subprocess.run(git + ["rev-parse", "--short=7", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()  # a commit without params.yaml: its gpu profile fails
    unmade = subprocess.run(script + [bare, str(tmp_path / "no.json")], capture_output=True, text=True)
    assert unmade.returncode == 1 and not (tmp_path / "no.json").exists()
    [line] = unmade.stderr.strip().splitlines()
    assert line.startswith(f"{bare}'s gpu profile failed: ")
    assert worktrees() == 1


def test_a_commit_before_the_capped_process_gets_one_line_not_a_worktree(tmp_path):
    """scripts/fingerprint_at.py on b8f3efe (the first H200 window's commit, fingerprinted uncapped): one line
    saying why no table comes, before any checkout (a window asks for it, gpu_plan.sh, and says it failed)."""
    known = subprocess.run(["git", "-C", str(REPO), "merge-base", "--is-ancestor", "b8f3efe", "a604021"], capture_output=True)
    if known.returncode != 0:
        pytest.skip("this copy holds no history of b8f3efe and a604021 (a scratch copy of scripts/mutate.py)")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "fingerprint_at.py"), "b8f3efe", str(tmp_path / "t.json")],
                          capture_output=True, text=True)
    assert done.returncode == 1 and not (tmp_path / "t.json").exists()
    assert done.stderr.strip().splitlines() == ["b8f3efe predates the capped fingerprint process (a604021): its code "
                                                "computes no table under a cap, and its runs' fingerprints stay in their own environment"]


def test_a_failed_fingerprint_process_says_why_in_one_line_and_keeps_nothing(params, tmp_path, monkeypatch):
    monkeypatch.setenv("CAPSNET_FINGERPRINT_CACHE", str(tmp_path))
    cfg = dataclasses.replace(run_config(params, "capsnet_r1", 0), image_size=3)  # under its 9×9 kernels
    with pytest.raises(fp.FingerprintError) as failed:
        fp.training_fingerprint(cfg)
    assert not list(tmp_path.glob("*.json"))  # the next asking tries again
    message = str(failed.value)
    assert message.startswith("capsnet_r1: the training fingerprint failed in its CPU process: ValueError: ")
    assert "too small" in message and "\n" not in message  # the child's own last line
    small = dataclasses.replace(fp.fingerprint_config(cfg), image_size=28, lr=1e30)  # its loss overflows
    with pytest.raises(fp.FingerprintError, match=r"process: NonFiniteLossError: fingerprint seed 0: non-finite loss at "
                       r"step \d+ \(epoch 1\) of the fingerprint's few CPU steps$"):  # not its scratch checkpoint, gone
        fp.in_capped_process([small])


def test_its_scratch_checkpoint_goes_to_dev_shm_only_where_there_is_room(tmp_path, monkeypatch):
    monkeypatch.setattr(fp, "SCRATCH", tmp_path)  # as /dev/shm
    assert fp.scratch() == tmp_path
    monkeypatch.setattr(fp, "SCRATCH_BYTES", 1 << 60)  # a container's 64 MB one, for a 280 MB checkpoint
    assert fp.scratch() is None
    monkeypatch.setattr(fp, "SCRATCH", tmp_path / "absent")
    assert fp.scratch() is None


def test_the_table_holds_what_each_variants_train_stage_configures_from_its_prepared_sets(tmp_path, monkeypatch):
    """`capsnet fingerprint` has no prepared sets: MultiMNIST's shift, which its train stage checks against its
    recipes (prepare.multimnist_max_shift), comes from params (`planned`), or the table would hold other
    fingerprints than its runs record and the queue would train them again in every window."""
    from pipeline.data.splits import prepare_mnist
    from pipeline.experiments import multimnist

    tiny_pipeline(tmp_path, transforms_per_digit=1)
    params = load_params(tmp_path / "params.yaml")
    mnist = prepare_mnist(tmp_path / "raw", tmp_path / "prepared", train_subset=0, test_subset=0)
    multimnist.prepare(params, mnist, tmp_path / "prepared", tmp_path / "figures")
    assert params.prepare.multimnist_max_shift != params.train.max_shift  # so the two can differ
    config = lambda cfg: json.dumps(dataclasses.asdict(fp.fingerprint_config(cfg)), sort_keys=True)  # noqa: E731
    monkeypatch.setattr(fp, "training_fingerprint", config)  # what each entry fingerprints
    variants = list(params.variants)
    table = fp.fingerprint_table(params, variants)
    for v in variants:
        cfg = run_config(params, v, 0)
        assert table[v] == config(cfg.experiment_module().configure(cfg, tmp_path / "prepared")), v
    # recipes prepared under another shift than the params': one line, before any training, not a run whose
    # pairs, config.json and fingerprint disagree (train was run by hand after params.yaml changed)
    from pipeline.core.errors import UserError

    cfg = run_config(params, "multimnist_r3_recon", 0)
    shift = params.prepare.multimnist_max_shift
    with pytest.raises(UserError, match=rf"up to {shift} px, but prepare.multimnist_max_shift is {shift + 1}: .*`dvc repro -f prepare`"):
        multimnist.configure(dataclasses.replace(cfg, max_shift=shift + 1), tmp_path / "prepared")


def test_the_probe_computes_each_cap_in_its_own_process_and_files_each_host_beside_the_others(tmp_path, monkeypatch):
    """scripts/fingerprint_probe.py: each probe's fingerprint comes from a capped process under CAPPED and that
    probe's settings (never another's), and a window's file, kept under its host's name, says per probe
    whether it computed what each other host's file holds."""
    probe = script("fingerprint_probe")

    recorded = fp.fingerprint_environment()  # what runs record, before and after a probe's other caps
    other = fp.in_capped_process([], caps={"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"})
    assert ", CPU DEFAULT capped, " in other["environment"] and fp.fingerprint_environment() == recorded
    asked = []

    def fake(smalls, caps=None):  # a fingerprint that follows the settings, as the host's kernels would
        asked.append(caps)
        return {"fingerprints": [json.dumps(caps, sort_keys=True)], "environment": f"torch x, CPU {caps['ATEN_CPU_CAPABILITY']}"}

    monkeypatch.setattr(probe.fp, "in_capped_process", fake)
    monkeypatch.setattr(probe.fp, "host_numerics", lambda: "AuthenticAMD, glibc 2.36")
    lines = probe.probe("capsnet_r3_recon", REPO / "params.yaml")
    assert [line["probe"] for line in lines] == list(probe.PROBES)
    assert sorted(map(json.dumps, asked)) == sorted(json.dumps(fp.CAPPED | s) for s in probe.PROBES.values())
    assert all(json.loads(line["fingerprint"]) == fp.CAPPED | probe.PROBES[line["probe"]] for line in lines)
    assert {line["host"] for line in lines} == {"AuthenticAMD, glibc 2.36"}
    here = tmp_path / "amd.jsonl"
    here.write_text("".join(json.dumps(line) + "\n" for line in lines))
    intel = [line | {"host": "GenuineIntel, glibc 2.39", "cpu": "Intel(R) Xeon(R) Processor"}
             | ({"fingerprint": "other"} if line["probe"] in ("capped", "mkl-strict") else {}) for line in lines]
    there = tmp_path / "window" / "fingerprint_probe.jsonl"
    there.parent.mkdir()
    there.write_text("".join(json.dumps(line) + "\n" for line in intel))
    folder = tmp_path / "kept"
    assert probe.keep(here, folder)[0].endswith("AuthenticAMD-glibc-2.36-torch-x.jsonl")
    said = probe.keep(there, folder)
    assert said[0] == f"fingerprint probe of Intel(R) Xeon(R) Processor (GenuineIntel, glibc 2.39) kept in {folder}/GenuineIntel-glibc-2.39-torch-x.jsonl"
    verdicts = dict(v.split(": ") for v in said[1].split(": ", 1)[1].split(", "))
    assert verdicts == {name: "differs" if name in ("capped", "mkl-strict") else "same" for name in probe.PROBES}


def test_the_probe_runs_every_cap_at_once_keeps_a_failed_one_and_compares_only_like_with_like(tmp_path, monkeypatch):
    """scripts/fingerprint_probe.py: all probes at once, a failing one a line with its settings and error;
    the host's processor by its model; a verdict says why two lines do not compare (one absent, an error on
    either side, another variant); a file is named by its host and torch (a failed first line aside), its
    blank lines skipped, compared with every other host's file but itself, in order; an empty one says so."""
    import threading

    probe = script("fingerprint_probe")
    together = threading.Barrier(len(probe.PROBES), timeout=30)  # broken unless every probe runs at once

    def fake(smalls, caps=None):
        together.wait()
        if caps.get("ATEN_CPU_CAPABILITY") == "default" and "GLIBC_TUNABLES" not in caps:
            raise fp.FingerprintError("the training fingerprint failed in its CPU process: ValueError: no")
        return {"fingerprints": ["f" * 16], "environment": "torch 2.15.0+cu132, CPU AVX2 capped"}

    monkeypatch.setattr(probe.fp, "in_capped_process", fake)
    monkeypatch.setattr(probe.fp, "host_numerics", lambda: "AuthenticAMD, glibc 2.36")
    monkeypatch.setattr(probe.fp, "cpuinfo", {"model name": "AMD EPYC 9B14", "vendor_id": "AuthenticAMD"}.get)
    lines = {line["probe"]: line for line in probe.probe("capsnet_r3_recon", REPO / "params.yaml")}
    failed = lines["aten-default"]
    assert failed["settings"] == fp.CAPPED | probe.PROBES["aten-default"] and "fingerprint" not in failed
    assert failed["error"].endswith("ValueError: no") and lines["capped"]["cpu"] == "AMD EPYC 9B14"
    mine = list(lines.values())
    theirs = []  # the other host's file: mkl-strict absent, capped failed there, libm-generic another variant's
    for line in mine:
        if line["probe"] == "mkl-strict":
            continue
        line = line | {"host": "GenuineIntel, glibc 2.39"}
        if line["probe"] == "capped":
            line = {k: v for k, v in line.items() if k != "fingerprint"} | {"error": "theirs failed"}
        if line["probe"] == "libm-generic":
            line["variant"] = "capsnet_r1"
        theirs.append(line)
    verdicts = dict(v.split(": ", 1) for v in probe.compare(mine, theirs))
    assert verdicts["mkl-strict"] == "not comparable (absent in one)"
    assert verdicts["aten-default"] == f"not comparable ({failed['error']})"
    assert verdicts["capped"] == "not comparable (theirs failed)"
    assert verdicts["libm-generic"] == "not comparable (capsnet_r3_recon and capsnet_r1)"
    assert verdicts["all-generic"] == "same"
    folder = tmp_path / "kept"
    files = {}
    for host, first_failed in (("GenuineIntel, glibc 2.39", True), ("AuthenticAMD, glibc 2.36", False),
                               ("ARM, glibc 2.40", False)):
        # Intel's file starts with its failed probe, which names no torch: its name reads torch from a later line
        ordered = sorted(mine, key=lambda line: "error" not in line) if first_failed else mine
        files[host] = tmp_path / f"{host[:3]}.jsonl"
        files[host].write_text("\n\n".join(json.dumps(line | {"host": host}) for line in ordered) + "\n")
    said = [probe.keep(files[host], folder) for host in files]
    assert said[0][0].endswith("kept in " + str(folder / "GenuineIntel-glibc-2.39-torch-2.15.0+cu132.jsonl"))
    assert [line.split(":")[0] for line in said[2][1:]] == [
        "  against AuthenticAMD-glibc-2.36-torch-2.15.0+cu132", "  against GenuineIntel-glibc-2.39-torch-2.15.0+cu132"]
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(json.dumps(failed | {"host": "AuthenticAMD, glibc 2.36"}) + "\n")
    assert probe.keep(unknown, folder)[0].endswith("AuthenticAMD-glibc-2.36-torch-unknown.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    assert probe.keep(tmp_path / "empty.jsonl", folder) == [f"{tmp_path / 'empty.jsonl'} holds no probe"]


def test_the_capped_process_imports_this_checkout_first_and_a_silent_failure_names_its_exit(monkeypatch):
    monkeypatch.syspath_prepend("/opt/elsewhere")
    path = fp.capped_env()["PYTHONPATH"].split(os.pathsep)
    assert path[0] == str(REPO) and "/opt/elsewhere" in path and path.count(str(REPO)) == 1
    monkeypatch.setenv("CAPSNET_FINGERPRINT_CACHE", "off")
    monkeypatch.setattr(fp.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 3, "", "\n"))
    with pytest.raises(fp.FingerprintError, match=r"failed in its CPU process: exit 3$"):
        fp.in_capped_process([])


def test_mkls_branch_reads_absent_unreported_or_its_number(monkeypatch):
    """Where torch has no MKL, where its library does not load or export the query, and a branch number
    the table does not name."""
    import types

    monkeypatch.setattr(fp.torch.backends.mkl, "is_available", lambda: False)
    assert fp.mkl_branch() == "absent"
    monkeypatch.setattr(fp.torch.backends.mkl, "is_available", lambda: True)

    def unloadable(path):
        raise OSError(f"{path}: cannot open shared object file")

    for library in (unloadable, lambda path: types.SimpleNamespace()):
        monkeypatch.setattr(fp.ctypes, "CDLL", library)
        assert fp.mkl_branch() == "unreported"
    monkeypatch.setattr(fp.ctypes, "CDLL", lambda path: types.SimpleNamespace(mkl_serv_cbwr_get=lambda what: 99))
    assert fp.mkl_branch() == "branch 99"


def test_the_environment_is_read_once_and_dev_shm_with_exactly_the_room_is_used(monkeypatch, tmp_path):
    monkeypatch.setattr(fp, "_ENVIRONMENT", ["torch 9, what a capped process reported"])
    assert fp.fingerprint_environment() == "torch 9, what a capped process reported"
    monkeypatch.setattr(fp, "SCRATCH", tmp_path)
    monkeypatch.setattr(fp.shutil, "disk_usage", lambda path: type("Usage", (), {"free": fp.SCRATCH_BYTES})())
    assert fp.scratch() == tmp_path


def test_the_table_computes_every_variant_at_once_in_order_and_stops_at_the_first_failure(params, monkeypatch):
    """fingerprint_table: a capped process per variant at once (as many as there are cores), the table in the
    variants' order, progress counted from 1 as each comes; a failure raised as it comes, before the
    progress of the variants still computing."""
    import threading

    variants = ["capsnet_r3_recon", "baseline_cnn", "capsnet_r1"]
    monkeypatch.setattr(fp.os, "cpu_count", lambda: 8)
    together = threading.Barrier(len(variants), timeout=30)  # broken unless all three compute at once

    def fingerprint(cfg):
        together.wait()
        return cfg.variant[:4]

    monkeypatch.setattr(fp, "training_fingerprint", fingerprint)
    said = []
    table = fp.fingerprint_table(params, variants, lambda done, variant: said.append(done))
    assert list(table.items()) == [("capsnet_r3_recon", "caps"), ("baseline_cnn", "base"), ("capsnet_r1", "caps")]
    assert said == [1, 2, 3]
    release = threading.Event()

    def failing(cfg):
        if cfg.variant == "capsnet_r1":
            raise fp.FingerprintError("capsnet_r1: failed")
        release.wait(30)  # the others finish after the failure
        return "x"

    monkeypatch.setattr(fp, "training_fingerprint", failing)
    said.clear()
    threading.Timer(1.0, release.set).start()
    with pytest.raises(fp.FingerprintError, match="capsnet_r1: failed"):
        fp.fingerprint_table(params, variants, lambda done, variant: said.append(variant))
    assert said == []  # no progress once a variant failed


def test_an_experiment_its_process_cannot_import_is_one_line_saying_where_to_register_it(tmp_path, monkeypatch):
    import pickle

    from pipeline.core.errors import UserError

    # the capped process's own cap (oneDNN off) would stay off in this test process: a later test's compiled
    # graph, cached by a process with oneDNN on, then met other convolution strides (CI, 2026-11-29)
    monkeypatch.setattr(fp, "cap_kernels", lambda: None)
    (tmp_path / "configs.pkl").write_bytes(pickle.dumps({"configs": [], "experiments": {"toy": "toy_notebook_cell"}}))
    with pytest.raises(UserError) as refused:
        fp.main(str(tmp_path))
    assert str(refused.value) == ("experiment 'toy' was registered from module 'toy_notebook_cell', which a process of "
                                  "its own cannot import (No module named 'toy_notebook_cell'): register an experiment "
                                  "from a module on the import path")
