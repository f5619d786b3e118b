"""The GPU machine as the tests stand it up: the working tree the device tool sends, python3 stubs on PATH,
one gpu_session.sh call, the plan up to its queue, and a published seed."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO, write_profile

# a CUDA test log as pytest finishes it (scripts/gpu_proof.py keeps only such a log)
FINISHED_LOG = "tests/test_gpu.py::test_x[capsnet_r3_recon] PASSED [100%]\n======= 1 passed in 3.21s =======\n"
CAPS, CNN = "bf16-compile-capture", "bf16-capture"  # the gpu profile's bench modes (tests/test_gpu_window.py asserts them)


def rows(capsnet_three=60_000.0, capsnet_one=24_000.0, cnn_one=27_000.0):
    return [{"variant": "capsnet_r3_recon", "mode": CAPS, "seeds": 3, "stack": "fused",
             "train_images_per_s": capsnet_three},
            {"variant": "capsnet_r3_recon", "mode": CAPS, "seeds": 1, "train_images_per_s": capsnet_one},
            {"variant": "capsnet_r3_recon", "mode": "bf16", "seeds": 1, "train_images_per_s": 1.0},  # not how it trains
            {"variant": "baseline_cnn", "mode": CNN, "seeds": 1, "train_images_per_s": cnn_one},
            {"variant": "baseline_cnn", "mode": "bf16-compile", "seeds": 1, "train_images_per_s": 1.0}]


def device_tree(tmp_path: Path) -> Path:
    """The working tree as the device tool sends it to the GPU machine (scripts, package, params),
    its data prepared before (no download there)."""
    work = tmp_path / "device"
    for part in ("scripts", "pipeline", "params.yaml"):
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy)(REPO / part, work / part)
    (work / "data" / "prepared").mkdir(parents=True)
    (work / "data" / "prepared" / "train.safetensors").write_text("prepared before")
    return work


def python3_on_path(tmp_path: Path, script: str, **env: str) -> dict:
    """The session's environment: ``script`` as its `python3` (first on PATH), $OUT under tmp_path, ``env``."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").write_text(script)
    (tmp_path / "bin" / "python3").chmod(0o755)
    return {**os.environ, "OUT": str(tmp_path / "out"), "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", **env}


def session_log(work: Path, env: dict, *args: str, timeout: int = 300) -> str:
    """One gpu_session.sh call with ``args`` in ``work``, which must pass; its own session.log ($OUT's)."""
    log = Path(env["OUT"]) / "session.log"
    log.unlink(missing_ok=True)
    done = subprocess.run(["bash", "scripts/gpu_session.sh", *args], cwd=work, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr + (log.read_text() if log.exists() else "")
    return log.read_text()


STUB_GPU = """#!%s
# python3 on a GPU window with its CUDA tests and training faked: `-m pytest` prints STUB_TESTS (after a
# moment: the first job trains meanwhile); `-m pipeline.cli train` records the speed settings of the
# --params it was given in each seed's config.json, as a run does; evaluate writes metrics; the fingerprint's
# probe and trace beside the tests do nothing (about 45 s of capped processes on 2 cores; their own tests:
# tests/test_fingerprint.py, tests/test_fingerprint_trace.py)
import json, os, sys, time
import yaml
args = sys.argv[1:]
if args[:2] == ["-m", "pytest"]:
    time.sleep(3)
    print(os.environ["STUB_TESTS"])
    sys.exit(0)
if args[:1] in (["scripts/fingerprint_probe.py"], ["scripts/fingerprint_trace.py"]):
    sys.exit(0)
if args[:2] == ["-m", "pipeline.cli"] and args[2] in ("train", "evaluate"):
    params = args[args.index("--params") + 1] if "--params" in args else ""
    with open("calls.log", "a") as log:
        print(" ".join([*args[2:5], os.path.basename(params)]).strip(), file=log)
    if args[2] == "evaluate":
        os.makedirs(args[5], exist_ok=True)
        open(os.path.join(args[5], "metrics.json"), "w").write("{}")
        sys.exit(0)
    raw = yaml.safe_load(open(params))
    train, model = raw["train"], raw["variants"][args[3]]["model"]
    cfg = {"model": model, "amp": train["amp"], "compile": train["compile"] and (model == "capsnet" or train["compile_cnns"]),
           "compile_mode": train["compile_mode"], "channels_last": train["channels_last"], "cuda_graph": train["cuda_graph"]}
    for s in args[4].split(","):
        os.makedirs(f"models/{args[3]}/seed{s}", exist_ok=True)
        json.dump({"config": cfg}, open(f"models/{args[3]}/seed{s}/config.json", "w"))
    sys.exit(0)
if args[:2] == ["-m", "pipeline.cli"]:
    sys.exit(0)  # fingerprint
os.execv(sys.executable, [sys.executable, *args])
"""


STUB_FINGERPRINT = """#!%s
# python3 on a GPU window with `capsnet fingerprint` faked: its table gives capsnet_r3_recon STUB_FP (none: it
# fails), each call in fp.log; scripts/fingerprint_at.py COMMIT OUT --variants V...: after STUB_AT_SLEEP
# seconds, a table of COMMIT here giving each V STUB_AT (none: it fails), each call in at.log
import json, os, sys, time
args = sys.argv[1:]
here = os.environ.get("STUB_ENV", "torch 2.11.0+cu130, CPU AVX2 capped")
if args[:3] == ["-m", "pipeline.cli", "fingerprint"]:
    print(" ".join(args[3:]), file=open("fp.log", "a"))
    if not os.environ.get("STUB_FP"):
        sys.exit("fingerprint: no capped process")
    time.sleep(float(os.environ.get("STUB_FP_SLEEP", 0)))
    json.dump({"commit": os.environ["CAPSNET_GIT_COMMIT"], "environment": here,
               "fingerprints": {"capsnet_r3_recon": os.environ["STUB_FP"]}}, open(args[3], "w"))
    sys.exit(0)
if args[:1] == ["scripts/fingerprint_at.py"]:
    print(" ".join(args[1:]), file=open("at.log", "a"))
    time.sleep(float(os.environ.get("STUB_AT_SLEEP", 0)))
    if not os.environ.get("STUB_AT"):
        sys.exit("fingerprint_at: no worktree")
    variants = args[args.index("--variants") + 1:]
    json.dump({"commit": args[1], "environment": here, "fingerprints": {v: os.environ["STUB_AT"] for v in variants}},
              open(args[2], "w"))
    sys.exit(0)
if args[:1] == ["scripts/gpu_window.py"] and "--paper" in args:
    time.sleep(float(os.environ.get("STUB_CHOICE_SLEEP", 0)))  # the window's choice, after the window was counted
os.execv(sys.executable, [sys.executable, *args])
"""


def plan_until_the_queue(tmp_path: Path) -> str:
    """scripts/gpu_plan.sh from its fingerprint table to the queue's answer, run in ``tmp_path`` (the
    package and scripts linked there, the gpu profile's params written), with STUB_FINGERPRINT as python3."""
    plan = (REPO / "scripts" / "gpu_plan.sh").read_text()
    fragment = plan[plan.index("mkdir -p logs fingerprints"):]
    fragment = fragment[:fragment.index("\n", fragment.index("ALONGSIDE=(--params")) + 1]
    for name in ("scripts", "pipeline", "params.yaml"):
        (tmp_path / name).symlink_to(REPO / name)
    write_profile(tmp_path / "params.gpu.yaml")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").write_text(STUB_FINGERPRINT % sys.executable)
    (tmp_path / "bin" / "python3").chmod(0o755)
    return "set -euo pipefail\nPLAN_START=$(date +%s)\n" + fragment + 'echo "$TRAIN"; echo "window: $KIND ${ALONGSIDE[*]}"'


def publish_seed0(tmp_path: Path, fingerprint: str, environment: str, commit: str | None = None,
                  variant: str = "capsnet_r3_recon", seed: int = 0, params: str = "params.gpu.yaml") -> None:
    """A published ``variant`` seed (0) under the protocol of ``params`` (the gpu profile's), as its config.json records it."""
    from pipeline.core.params import load_params
    from pipeline.training.config import run_config

    cfg = dataclasses.asdict(run_config(load_params(tmp_path / params), variant, seed))
    folder = tmp_path / "reports" / "runs" / "models" / variant / f"seed{seed}"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "config": {k: v for k, v in cfg.items() if v is not None}, "params": {"device": "cuda"},
        "training_fingerprint": fingerprint,
        "environment": {"fingerprint_environment": environment} | ({"git_commit": commit} if commit else {})}))
