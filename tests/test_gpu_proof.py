"""The CUDA tests' proof (scripts/gpu_proof.py): a finished log of the CUDA tests kept under the key of the
code and the GPU (and driver) they ran on, so a later window at the same code and GPU (a paper-protocol
window, whose training fills it: tests/test_gpu_paper.py) does not run them again; the import keeps
each call's log; one line for a missing file or an unfinished log."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import REPO, script
from gpu_device import CAPS, FINISHED_LOG, STUB_GPU, device_tree, python3_on_path, session_log

gpu_proof = script("gpu_proof")

CUDA_FILES = ["tests/test_gpu.py", "tests/test_capture_gpu.py"]


def test_the_cuda_tests_proof_is_kept_under_the_code_and_gpu_it_ran_on(tmp_path):
    """scripts/gpu_proof.py: the key changes with any file of the package, params.yaml, the tests' helpers or
    a named test file, and with the GPU or torch; a log pytest did not finish is never kept; a kept log is
    found only under its own key."""
    root = tmp_path / "tree"
    shutil.copytree(REPO / "pipeline", root / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "tests").mkdir()
    for part in ("params.yaml", "tests/conftest.py", "tests/tracking_stack.py", *CUDA_FILES):
        shutil.copy(REPO / part, root / part)
    base = gpu_proof.code_digest(root, CUDA_FILES)
    for edited in ("pipeline/training/steps.py", "params.yaml", "tests/tracking_stack.py", "tests/test_capture_gpu.py"):
        before = (root / edited).read_bytes()
        (root / edited).write_bytes(before + b"\n")
        assert gpu_proof.code_digest(root, CUDA_FILES) != base, edited
        (root / edited).write_bytes(before)
    (root / "pipeline" / "__pycache__").mkdir(exist_ok=True)
    (root / "pipeline" / "__pycache__" / "x.cpython-312.pyc").write_bytes(b"bytecode")
    (root / "README.md").write_text("not code")
    assert gpu_proof.code_digest(root, CUDA_FILES) == base
    with pytest.raises(FileNotFoundError, match="test_missing.py"):
        gpu_proof.code_digest(root, ["tests/test_missing.py"])

    key = {"code": base, "torch": "2.11.0+cu130", "cuda": "13.0", "gpu": "NVIDIA H200", "driver": "580.1"}
    kept = tmp_path / "kept"
    assert gpu_proof.keep(key, "tests/test_gpu.py::test_x PASSED [ 50%]\n", kept) is None  # cut off by the deadline
    assert gpu_proof.find(kept, key) is None
    path = gpu_proof.keep(key, FINISHED_LOG, kept)
    assert gpu_proof.find(kept, key) == path and path.read_text().split("\n", 1)[1] == FINISHED_LOG
    for part, other in (("code", "0" * 64), ("gpu", "NVIDIA H100 80GB HBM3"), ("torch", "2.12.0"), ("driver", "590.2")):
        assert gpu_proof.find(kept, key | {part: other}) is None, part
    # a file under the key's name is the proof only with that key on its first line and pytest's summary after it
    # (a name is 16 hex digits of the key's digest; a log cut short by hand is not a finished run)
    for first, log in ((json.dumps(key | {"gpu": "NVIDIA H100 80GB HBM3"}), FINISHED_LOG),
                       (json.dumps(key, sort_keys=True), FINISHED_LOG.splitlines()[0] + "\n")):
        path.write_text(first + "\n" + log)
        assert gpu_proof.find(kept, key) is None


def test_a_window_at_code_whose_cuda_tests_ran_before_does_not_run_them_again(tmp_path):
    """gpu_session.sh --tests where reports/bench/<this device>/cuda-tests/ holds a finished log under this
    tree's key: no pytest runs, the jobs train alone (no tests beside them) with the levers that log
    proves; the import keeps a call's log under the key the call wrote (scripts/gpu_proof.py)."""
    from pipeline.training.bench import device_name, device_slug, resolve_device

    work = device_tree(tmp_path)
    (work / "tests").mkdir()
    for f in ("tests/conftest.py", *gpu_proof.CUDA_TEST_FILES, *(p.relative_to(REPO).as_posix() for p in
              (REPO / "tests").glob("*.py") if not p.name.startswith("test_"))):
        shutil.copy(REPO / f, work / f)
    (work / "logs" / "bench").mkdir(parents=True)
    (work / "logs" / "bench" / "caps.jsonl").write_text(json.dumps(
        {"variant": "capsnet_r3_recon", "mode": CAPS, "seeds": 1, "captured": True, "train_images_per_s": 1e9}) + "\n")
    capture = "tests/test_capture_gpu.py::test_the_captured_step_replays_what_the_eager_step_computes"
    log = (f"{capture}[capsnet_r3_recon-bf16-compiled-fused-1seed] PASSED [ 50%]\n"
           "tests/test_gpu.py::test_compiled_bf16_stacked_training_steps_stay_finite[capsnet_r3_recon] PASSED [100%]\n"
           "======= 2 passed in 120.50s =======\n")
    env = python3_on_path(tmp_path, STUB_GPU % sys.executable, CAPSNET_GPU_PROFILE="gpu", CAPSNET_GIT_COMMIT="",
                          STUB_TESTS="tests/test_gpu.py::whatever FAILED\n======= 1 failed in 1.00s =======")
    key = json.loads(subprocess.run([sys.executable, "scripts/gpu_proof.py", "key"], cwd=work,
                                    env={**env, "PATH": os.environ["PATH"]}, capture_output=True, text=True, check=True).stdout)
    gpu_proof.keep(key, log, work / "reports" / "bench" / device_slug(device_name(resolve_device("auto"))) / "cuda-tests")
    session = session_log(work, env, "--tests", "--levers", "--train", "capsnet_r3:0", "--deadline", "300")
    assert "CUDA tests not run: an earlier window ran them" in session and "beside the first jobs" not in session
    assert not (tmp_path / "out" / "gpu_tests.key").exists()
    assert (work / "logs" / "gpu_tests.txt").read_text() == log  # what the levers and the runs' proofs read
    # the levers come first, from that log: the job trains with them (compiled and captured, as it proves)
    assert (work / "calls.log").read_text().splitlines() == ["train capsnet_r3 0 params.gpu.capsnet.yaml",
                                                             "evaluate models/capsnet_r3/seed0 data/prepared"]
    assert json.loads((work / "models/capsnet_r3/seed0/config.json").read_text())["config"]["cuda_graph"] is True
    # gpu_plan.sh's answer, where it asked first (logs/tests.kept, once a machine), is taken as it is
    elsewhere = tmp_path / "kept-elsewhere.txt"
    shutil.copy(next((work / "reports" / "bench").glob("*/cuda-tests/*.txt")), elsewhere)
    (work / "logs" / "tests.kept").write_text(f"{elsewhere}\n")
    shutil.rmtree(tmp_path / "out")
    done = subprocess.run(["bash", "scripts/gpu_session.sh", "--tests", "--deadline", "300"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and f"CUDA tests not run: an earlier window ran them under this code, torch and GPU ({elsewhere}" \
        in (tmp_path / "out" / "session.log").read_text()
    (work / "logs" / "tests.kept").unlink()
    # an edit to the package: the tests run again (the stub's log fails them), and their key comes back
    (work / "pipeline" / "training" / "steps.py").write_text((work / "pipeline" / "training" / "steps.py").read_text() + "\n")
    shutil.rmtree(tmp_path / "out")
    for stale in ("logs/gpu_tests.txt", "models", "gpu_results", "calls.log"):
        shutil.rmtree(work / stale) if (work / stale).is_dir() else (work / stale).unlink()
    session = session_log(work, env, "--tests", "--train", "capsnet_r3:0", "--deadline", "300")
    assert "CUDA tests beside the first jobs" in session
    with tarfile.open(tmp_path / "out" / "checks.tar.gz") as checks:
        assert json.loads(checks.extractfile("gpu_tests.key").read())["code"] != key["code"]


def test_the_import_keeps_a_calls_finished_cuda_test_log_under_its_key(tmp_path):
    """gpu_import.sh: the CUDA tests' log and key in a call's checks.tar.gz go to reports/bench/<model>/cuda-tests/,
    where the next window at that code finds them (scripts/gpu_proof.py); a log the deadline cut is not kept."""
    script = (REPO / "scripts" / "gpu_import.sh").read_text()
    fragment = script[script.index("n=0\nfor folder in"):]
    fragment = fragment[:fragment.index("\ndone\n") + 6]
    (tmp_path / "scripts").symlink_to(REPO / "scripts")
    key = {"code": "c" * 64, "torch": "2.11.0+cu130", "cuda": "13.0", "gpu": "NVIDIA H200", "driver": "580.1"}
    calls = []
    for n, log in enumerate((FINISHED_LOG, "tests/test_gpu.py::test_x PASSED [ 50%]\n")):
        call = tmp_path / f"call{n}"
        call.mkdir()
        (call / "gpu_tests.txt").write_text(log)
        (call / "gpu_tests.key").write_text(json.dumps(key | {"driver": str(n)}))
        with tarfile.open(call / "checks.tar.gz", "w:gz") as tar:
            for name in ("gpu_tests.txt", "gpu_tests.key"):
                tar.add(call / name, arcname=name)
                (call / name).unlink()
        calls.append(str(call))
    done = subprocess.run(["bash", "-c", f"folders=({' '.join(calls)}); BIN={Path(sys.executable).parent}\n{fragment}"],
                          cwd=tmp_path, capture_output=True, text=True)
    kept = tmp_path / "reports" / "bench" / "nvidia-h200" / "cuda-tests"
    assert "kept as the proof" in done.stdout and "not kept as a proof" in done.stderr, done.stdout + done.stderr
    assert gpu_proof.find(kept, key | {"driver": "0"}) is not None and len(list(kept.iterdir())) == 1


def test_the_cuda_tests_key_changes_with_a_files_name_and_only_pytests_summary_line_finishes_a_log(tmp_path):
    """scripts/gpu_proof.py: a file renamed (its content the same) is other code; a log that merely mentions
    a count of passed tests in a test's output is not finished."""
    root = tmp_path / "tree"
    (root / "pipeline").mkdir(parents=True)
    (root / "tests").mkdir()
    for part in ("params.yaml", "tests/conftest.py"):
        shutil.copy(REPO / part, root / part)
    (root / "pipeline" / "a.py").write_text("x = 1\n")
    base = gpu_proof.code_digest(root, [])
    (root / "pipeline" / "a.py").rename(root / "pipeline" / "b.py")
    assert gpu_proof.code_digest(root, []) != base
    assert not gpu_proof.finished("tests/test_gpu.py::test_x PASSED [ 50%]\nE   assert '3 passed in 1.0s' == ''\n")
    assert gpu_proof.finished(FINISHED_LOG)
    assert gpu_proof.finished("tests/test_gpu.py::test_x FAILED [100%]\n======= 1 failed in 3.21s =======\n")  # kept as it is
    # conftest.py is a helper module: its content is in the key
    renamed = gpu_proof.code_digest(root, [])
    (root / "tests" / "conftest.py").write_text("# changed\n")
    assert gpu_proof.code_digest(root, []) != renamed


def test_the_proofs_command_line_names_a_missing_cuda_test_file_in_one_line_and_finds_no_log_with_exit_1(tmp_path):
    """scripts/gpu_proof.py key: a file CUDA_TEST_FILES names that is not there is one line naming it and
    what to do (gpu_session.sh logs it); find: exit 1 and nothing printed where no log is kept (the
    session then runs the CUDA tests)."""
    tree = tmp_path / "tree"
    for part in ("scripts/gpu_proof.py", "params.yaml", "tests/conftest.py"):
        (tree / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / part, tree / part)
    (tree / "pipeline").mkdir()
    done = subprocess.run([sys.executable, str(tree / "scripts" / "gpu_proof.py"), "key"], capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [f"{sorted(gpu_proof.CUDA_TEST_FILES)[0]}: a CUDA test file scripts/gpu_proof.py names "
                                        "(CUDA_TEST_FILES) is missing: restore it or name the file that holds its tests"]
    (tmp_path / "bench").mkdir()
    none = subprocess.run([sys.executable, "scripts/gpu_proof.py", "find", str(tmp_path / "bench")], cwd=REPO,
                          capture_output=True, text=True)
    assert (none.returncode, none.stdout) == (1, ""), none.stderr


def test_the_cuda_tests_key_names_the_driver_nvidia_smi_reports_and_an_unfinished_log_is_refused_in_one_line(
        tmp_path, monkeypatch, capsys):
    """scripts/gpu_proof.py: the machine's part of the key holds the driver `nvidia-smi` reports (none where
    there is no nvidia-smi) beside torch's and CUDA's versions; `keep` refuses a log pytest did not
    finish with exit 1 and one line naming it, and keeps nothing."""
    import torch

    stub = tmp_path / "bin" / "nvidia-smi"
    stub.parent.mkdir()
    stub.write_text('#!/bin/sh\n[ "$*" = "--query-gpu=driver_version --format=csv,noheader" ] && echo 580.95.05\n')
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stub.parent}{os.pathsep}{os.environ['PATH']}")
    machine = gpu_proof.machine()
    assert (machine["driver"], machine["torch"], machine["cuda"]) == ("580.95.05", torch.__version__, str(torch.version.cuda))
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert gpu_proof.machine()["driver"] == ""

    key = tmp_path / "gpu_tests.key"
    key.write_text(json.dumps({"code": "0" * 64, **machine}))
    log = tmp_path / "gpu_tests.log"
    log.write_text("tests/test_gpu.py::test_x PASSED [ 50%]\n")
    assert gpu_proof.main(["keep", str(key), str(log), str(tmp_path / "bench")]) == 1
    assert capsys.readouterr().err == f"{log}: pytest did not finish it (no summary line): not kept as a proof\n"
    assert not (tmp_path / "bench").exists()
