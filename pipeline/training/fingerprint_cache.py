"""A disk cache of training fingerprints, keyed by everything that decides them.

A fingerprint is a deterministic function of the package's code, the small configuration, and the
capped process's environment (torch's build, the processor, the C library, the kernels' settings), so each is computed
once per key instead of once per process: a train stage that follows `capsnet fingerprint` on a GPU
machine finds its variant's fingerprint there instead of spending seconds of CPU before its first step,
and the test suite's stage processes stop recomputing what an earlier one computed. The key hashes
every file of the package, so any edit (a mutation of scripts/mutate.py too) misses the cache; a run
whose experiment was registered from outside the package is never cached (its code is not in the key).

Where: $CAPSNET_FINGERPRINT_CACHE (a folder; `off`: no cache), else $XDG_CACHE_HOME/capsnet-repro/
fingerprints (~/.cache/...). One JSON file per key, written whole (a temporary file renamed); a file
that does not read as one is computed again; processes missing one key wait for the first to write it.
Every edit of the package makes new keys, so each write removes the entries (and their lock files) no
process has read or written for KEEP_DAYS: an answer removed is only computed again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

from pipeline.core import registry

CACHE_ENV = "CAPSNET_FINGERPRINT_CACHE"
LOG_ENV = "CAPSNET_FINGERPRINT_LOG"  # a file: a line per lookup (`log`)
# the environment variables that may reach the capped process's arithmetic: kernels' and threads' settings,
# the libraries loaded (its code and torch are keyed apart). Not torch.compile's (TORCHINDUCTOR_*,
# TORCHDYNAMO_*): the fingerprint never compiles, and a GPU session sets them for its jobs, not for the
# table whose answers those jobs are to find
KERNEL_ENV = ("ATEN_", "MKL", "OMP_", "KMP_", "GOMP_", "DNNL_", "ONEDNN_", "OPENBLAS_", "TORCH_", "PYTORCH_", "LD_")
# set by an import, not by whoever runs the process: scikit-learn and threadpoolctl (MLflow imports them) call
# os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "True"), which lets Intel's OpenMP load beside another and
# changes no arithmetic; keyed, a process that had imported them missed every answer another had kept
# (the suite's workers missed the smoke's keys so, 2026-12-02)
IMPORTED_ENV = frozenset({"KMP_DUPLICATE_LIB_OK"})
PACKAGE = Path(__file__).resolve().parents[1]  # pipeline/: the code a capped process imports
CPUINFO = Path("/proc/cpuinfo")  # what Linux says of the processor (`cpuinfo`)
KEEP_DAYS = 30  # an entry unused this long goes at the next write (its code has most likely changed since)
OURS = re.compile(r"[0-9a-f]{64}\.(json|lock)|tmp\w+\.tmp")  # `key`'s files, `write`'s temporaries

try:
    import fcntl
except ImportError:  # not on Windows: two processes missing one key then both compute it
    fcntl = None


def folder() -> Path | None:
    """Where the cache lives; None where $CAPSNET_FINGERPRINT_CACHE is `off`."""
    where = os.environ.get(CACHE_ENV, "")
    if where == "off":
        return None
    if where:
        return Path(where)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "capsnet-repro" / "fingerprints"


@functools.lru_cache(maxsize=None)  # the code cannot change within a process
def code_digest(root: Path = PACKAGE) -> str:
    """SHA-256 over every file under ``root`` (its path and bytes), compiled bytecode aside."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(f"{path.relative_to(root).as_posix()}:{path.stat().st_size}:".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cpuinfo(field: str) -> str:
    """The first value of ``field`` in /proc/cpuinfo ('vendor_id': 'AuthenticAMD'); '' where Linux does not say."""
    try:
        lines = CPUINFO.read_text().splitlines()
    except OSError:
        return ""
    return next((line.partition(":")[2].strip() for line in lines if line.partition(":")[0].strip() == field), "")


@functools.lru_cache(maxsize=1)
def processor() -> str:
    """The processor's vendor, model and features (`cpuinfo`'s, where Linux has them)."""
    fields = ("vendor_id", "model name", "flags", "Features", "CPU implementer", "CPU part")
    return "; ".join(f"{f}: {v}" for f in fields if (v := cpuinfo(f))) or f"{platform.machine()} {platform.processor()}"


def key(smalls: list, env: dict[str, str]) -> str | None:
    """The cache key of ``smalls``' fingerprints computed by a process with environment ``env``; None
    where an experiment registered from outside the package takes part."""
    if registry.plugins():
        return None
    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    built = library.stat() if library.exists() else None
    parts = {"code": code_digest(), "configs": [dataclasses.asdict(s) for s in smalls],
             "python": [sys.executable, sys.version], "processor": processor(), "libc": platform.libc_ver(),
             "torch": [torch.__version__, str(library), built and built.st_size, built and built.st_mtime_ns],
             "environment": {k: v for k, v in sorted(env.items()) if k.startswith(KERNEL_ENV) and k not in IMPORTED_ENV}}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def read(path: Path, count: int) -> dict | None:
    """The cached answer at ``path`` if it holds ``count`` fingerprints and an environment, else None."""
    try:
        out = json.loads(path.read_text())
        valid = len(out["fingerprints"]) == count and all(isinstance(f, str) for f in out["fingerprints"]) \
            and isinstance(out["environment"], str)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return out if valid else None


def write(path: Path, out: dict) -> None:
    """``out`` to ``path`` whole: a reader sees the old file, the new one or none."""
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as tmp:
        tmp.write(json.dumps({"fingerprints": out["fingerprints"], "environment": out["environment"]}))
    os.replace(tmp.name, path)


def cached(smalls: list, env: dict[str, str], compute) -> dict:
    """``compute()``'s answer for ``smalls`` under ``env``, from the cache where it holds it, else
    computed and kept; a cache folder that cannot be written only costs the computing. Each lookup is
    a line of $CAPSNET_FINGERPRINT_LOG where that names a file (`log`)."""
    t0, spans = time.perf_counter(), []  # spans: when compute() started and ended, if it ran

    def timed() -> dict:
        spans.append(time.perf_counter())
        out = compute()
        spans.append(time.perf_counter())
        return out

    where, name = folder(), key(smalls, env)
    answer, out = lookup(smalls, where, name, timed)
    if os.environ.get(LOG_ENV):
        waited = (spans[0] if spans else time.perf_counter()) - t0
        log(smalls, where, name, answer, waited, spans[1] - spans[0] if spans else 0.0)
    return out


def lookup(smalls: list, where: Path | None, name: str | None, compute) -> tuple[str, dict]:
    """("found" | "computed" | "not cached", the answer) of `cached`."""
    if where is None or name is None:
        return "not cached", compute()
    try:
        where.mkdir(parents=True, exist_ok=True)
        lock = open(where / f"{name}.lock", "w")  # noqa: SIM115 (held until the answer is written)
    except OSError:
        return "not cached", compute()
    with lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process computing this key: its answer, once written
        path = where / f"{name}.json"
        out = read(path, len(smalls))
        if out is None:
            out = compute()
            with contextlib.suppress(OSError):
                write(path, out)
                prune(where)
            return "computed", out
        with contextlib.suppress(OSError):
            os.utime(path)  # in use: kept by `prune`
        return "found", out


def family(small) -> str:
    """What a fingerprint's small configuration trains, in a few words: "table1 capsnet r3 recon official 28px"."""
    routing = f" r{small.routing_iterations}" if small.model == "capsnet" else ""
    return (f"{small.experiment_name} {small.model}{routing}{' recon' if small.reconstruction else ''} "
            f"{small.recipe} {small.image_size}px")


def log(smalls: list, where: Path | None, name: str | None, answer: str, waited: float, computing: float) -> None:
    """A JSON line appended to $CAPSNET_FINGERPRINT_LOG: the lookup's families, cache folder (None: no cache),
    key, answer, the seconds before computing (the key, the lock's wait) and those computing, its process
    and test (scripts/fingerprint_log.py sums them: docs/performance.md). A line that cannot be written
    costs nothing."""
    line = {"families": [family(s) for s in smalls], "key": name, "cache": where and str(where), "answer": answer,
            "wait_s": round(waited, 3), "compute_s": round(computing, 3), "pid": os.getpid(),
            "test": os.environ.get("PYTEST_CURRENT_TEST", "").rpartition(" (")[0] or None}
    with contextlib.suppress(OSError), open(os.environ[LOG_ENV], "a") as f:
        f.write(json.dumps(line) + "\n")  # one write of a short line: appends from several processes stay whole


def prune(where: Path, days: float = KEEP_DAYS) -> None:
    """Remove the entries, lock files and torn writes in ``where`` that nothing has read or written for
    ``days``; only files the cache names (a key's, `write`'s temporaries): $CAPSNET_FINGERPRINT_CACHE may
    name a folder that holds other files."""
    oldest = time.time() - days * 86400
    for path in where.iterdir():
        with contextlib.suppress(OSError):
            if OURS.fullmatch(path.name) and path.stat().st_mtime < oldest:
                path.unlink()
