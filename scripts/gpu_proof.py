"""The CUDA tests' outcome, kept per code and per GPU (issue #36): a window whose code, torch, CUDA and GPU
model the CUDA tests already ran under in an earlier window takes that run's log instead of running them
again, and so has its GPU to itself from its first second (the tests shared it with the first jobs for
about 130 s of every H200 window; the paper protocol's seed needs the whole window: docs/gpu-sessions.md).

    python3 scripts/gpu_proof.py files                       # the files holding CUDA-only tests (gpu_session.sh runs them)
    python3 scripts/gpu_proof.py key                         # this tree's and this machine's key (JSON)
    python3 scripts/gpu_proof.py find reports/bench          # the kept log of that key, or exit 1
    python3 scripts/gpu_proof.py keep KEY LOG reports/bench  # keep a finished log under its key (the import)

Logs are kept in reports/bench/<GPU model>/cuda-tests/ (the model's folder of bench rows). The key is what
the tests' outcome depends on: the SHA-256 of the code they run (every file of pipeline/, params.yaml,
tests/conftest.py and the tests' helper modules, and CUDA_TEST_FILES), torch's and CUDA's versions, the
GPU's name and its driver. A commit
that changes none of these (a README, a script, the report) keeps the proof; one that changes any file
of the package runs the tests again, whatever it changed. Only a log pytest finished (its summary
line) is kept: a run the deadline cut off proves nothing. A kept log with failures is reused as it is
(the same code fails the same tests; their levers stay unproven until the code changes).

Torch is imported by `key`, `find` and `keep` (the GPU's name and versions, its folder's name), not by `files`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CODE = ("pipeline", "params.yaml")  # and tests/*.py that are not test files: conftest.py and the helpers
# the test files holding CUDA-only tests (tests/test_wiring.py checks that this list names every one)
CUDA_TEST_FILES = ("tests/test_gpu.py", "tests/test_capture_gpu.py", "tests/test_wiring.py", "tests/test_multimnist.py")
FINISHED = re.compile(r"^=+ .*\b(passed|failed|error|errors|skipped|deselected)\b.* in [0-9.]+s.*=+$", re.M)


def code_files(root: Path, tests: list[str]) -> list[Path]:
    """Every file whose content the key hashes, sorted: the package (no bytecode), params.yaml, the tests'
    conftest and helper modules (tests/*.py but test_*.py), and the named test files."""
    files = [p for part in CODE for p in ([root / part] if (root / part).is_file() else sorted((root / part).rglob("*")))
             if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    helpers = [p for p in sorted((root / "tests").glob("*.py")) if not p.name.startswith("test_")]
    return sorted({*files, *helpers, *(root / t for t in tests)})


def code_digest(root: Path, tests: list[str]) -> str:
    """SHA-256 over each code file's path (relative to ``root``) and content."""
    digest = hashlib.sha256()
    for path in code_files(root, tests):
        if not path.is_file():
            raise FileNotFoundError(f"{path.relative_to(root)}: a CUDA test file scripts/gpu_proof.py names "
                                    "(CUDA_TEST_FILES) is missing: restore it or name the file that holds its tests")
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def machine() -> dict[str, str]:
    """torch's and CUDA's versions, the device's name as bench rows give it (the GPU's model; on a CPU its
    threads) and the driver."""
    import torch  # here, not above: `files` needs none

    from pipeline.training.bench import device_name, resolve_device

    gpu = device_name(resolve_device("auto"))
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.split("\n")[0].strip()
    except (OSError, subprocess.TimeoutExpired):
        driver = ""
    return {"torch": torch.__version__, "cuda": str(torch.version.cuda), "gpu": gpu, "driver": driver}


def key(root: Path, tests: list[str] | tuple[str, ...] = CUDA_TEST_FILES) -> dict[str, str]:
    return {"code": code_digest(root, list(tests)), **machine()}


def folder_of(bench: Path, k: dict) -> Path:
    """Where the logs of key ``k``'s GPU are kept: its bench rows' folder (reports/bench/<model>/), cuda-tests/."""
    from pipeline.training.bench import device_slug

    return bench / device_slug(k["gpu"]) / "cuda-tests"


def name_of(k: dict) -> str:
    """The kept log's file name: the key's own digest (any part changed, another file)."""
    return hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:16] + ".txt"


def finished(log: str) -> bool:
    """Whether pytest ended the log with its summary line (a run cut off by the deadline has none)."""
    return bool(FINISHED.search(log))


def find(folder: Path, k: dict) -> Path | None:
    """The kept log of key ``k`` in ``folder`` (its first line is the key it was kept under), or None."""
    path = folder / name_of(k)
    if not path.is_file():
        return None
    first, _, log = path.read_text().partition("\n")
    return path if json.loads(first) == k and finished(log) else None


def keep(k: dict, log: str, folder: Path) -> Path | None:
    """Write ``log`` under key ``k`` in ``folder`` (the key on the first line), if pytest finished it."""
    if not finished(log):
        return None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name_of(k)
    path.write_text(json.dumps(k, sort_keys=True) + "\n" + log)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("files", help="print the files holding CUDA-only tests")
    verbs.add_parser("key", help="print this tree's and machine's key")
    found = verbs.add_parser("find", help="print the kept log of this key under BENCH, exit 1 where none")
    found.add_argument("bench", type=Path)
    kept = verbs.add_parser("keep", help="keep a finished pytest log under the key in KEY")
    kept.add_argument("key", type=Path)
    kept.add_argument("log", type=Path)
    kept.add_argument("bench", type=Path)
    args = parser.parse_args(argv)
    if args.verb == "files":
        print(" ".join(CUDA_TEST_FILES))
        return 0
    if args.verb in ("key", "find"):
        try:
            k = key(REPO)
        except FileNotFoundError as missing:
            print(missing, file=sys.stderr)
            return 1
    if args.verb == "key":
        print(json.dumps(k, sort_keys=True))
        return 0
    if args.verb == "find":
        path = find(folder_of(args.bench, k), k)
        if path is None:
            return 1
        print(path)
        return 0
    k = json.loads(args.key.read_text())
    path = keep(k, args.log.read_text(), folder_of(args.bench, k))
    if path is None:
        print(f"{args.log}: pytest did not finish it (no summary line): not kept as a proof", file=sys.stderr)
        return 1
    print(f"CUDA tests' log kept as the proof of its code on its GPU: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
