"""The training fingerprint: what a run's training code computes, as one short hash.

Runs from several GPU windows, weeks and commits apart, must still compare; the commit cannot
say whether two runs trained the same way (a README edit changes it, a changed kernel may not).
The fingerprint can: the SHA-256 of every seed's fp32 weights after a few deterministic CPU steps
of a small fixed configuration of the run's model and experiment family — two stacked seeds,
augmentation, dropout, reconstruction, Adam and the learning-rate formula included — run through
the same `train.train_group` the run itself trains with. A change that alters what training
computes changes it; a refactor or a speed lever that computes the same does not
(tests/test_fingerprint.py pins it per family, so a change is a visible, deliberate edit).

fp32 results on the CPU depend on the kernels torch picks for the processor and on the thread
count. So the fingerprint runs in a process of its own, on one thread, with ATen's vector kernels
capped at AVX2, MKL's GEMM in its conditional-numerical-reproducibility COMPATIBLE branch (SSE2 without
approximate instructions: the one branch MKL honours on Intel's and on other vendors' processors alike;
its AVX2 branch is Intel's only, elsewhere MKL silently runs AUTO) and oneDNN off (`CAPPED`). On
2026-11-26 this AMD EPYC's AVX512 kernels gave other fingerprints than the project's AVX2 machine; on
2026-11-27 the H200 host's processor computed other AVX2-capped fingerprints than this AMD EPYC, whose
MKL had ignored MKL_CBWR=AVX2; and once MKL ran COMPATIBLE on both, the H200 host's Intel Xeon
(glibc 2.39) still computed other fingerprints than this AMD EPYC (glibc 2.36) with the same torch
build, every family (2026-11-27 07:22; which kernel differs is not known). The environment recorded
with a fingerprint (`fingerprint_environment`) is torch's version, the capped ATen capability, the
branch MKL itself reports running (`mkl_branch`), and the two things those processors' hosts differed
in besides the model: the processor's vendor and the C library (`host_numerics`). Fingerprints of
different environments do not compare, and a table of a run's own commit computed in another
environment carries its runs there (pipeline.core.lineage; the GPU window computes those tables on its
own host, scripts/gpu_plan.sh).

A fingerprint covers its run's own model, so two variants' never agree: the report compares two
variants' rows through a commit whose code computed both fingerprints. Runs of one commit share it;
runs of two GPU windows at two commits share one through a *table* (`fingerprint_table`, `capsnet
fingerprint`), every variant's fingerprint as one commit's code computes them, which each GPU
window writes before it asks its queue (scripts/gpu_plan.sh). Each fingerprint is computed once per
code, configuration and environment and kept on disk (pipeline.training.fingerprint_cache).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import importlib
import io
import json
import os
import pickle
import platform
import shutil
import subprocess
import sys
import tempfile
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import torch

from pipeline.core import registry
from pipeline.core.errors import UserError, first_line
from pipeline.core.params import Params
from pipeline.training import fingerprint_cache
from pipeline.training.fingerprint_cache import cpuinfo  # the probe's host line too (scripts/fingerprint_probe.py)
from pipeline.training.checkpoint import NonFiniteLossError
from pipeline.training.config import RunConfig, run_config
from pipeline.training.train import train_group

SEEDS = (0, 1)  # two stacked seeds: the stack's own arithmetic is part of what is fingerprinted
STEPS = 2  # per epoch; two epochs: a new order, the checkpoint written between them
EXAMPLES = 4  # training and test examples; batches of two
# the one checkpoint train_group writes (the baseline's is 280 MB): in memory where Linux offers it
SCRATCH, SCRATCH_BYTES = Path("/dev/shm"), 1 << 30  # several capped processes write theirs at once
# the capped process's kernels (oneDNN's it turns off), read once at a process's start: ATen's vector
# kernels at AVX2, MKL's GEMM in its reproducible branch for any vendor's processor
CAPPED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"}
# mkl_cbwr_get(MKL_CBWR_BRANCH)'s answers (oneMKL's mkl_cbwr.h); libtorch_cpu exports it as mkl_serv_cbwr_get
MKL_BRANCHES = {1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2", 9: "AVX",
                10: "AVX2", 12: "AVX512", 14: "AVX512_E1"}


class FingerprintError(UserError, RuntimeError):
    """The process computing a fingerprint failed: its last line of errors says why."""


@contextlib.contextmanager
def one_thread():
    """Run the block on one CPU thread (reductions then add in one order whatever the machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def fingerprint_config(cfg: RunConfig) -> RunConfig:
    """The small fixed configuration that fingerprints ``cfg``: its model and family (model,
    routing, reconstruction, recipe, image size, classes, augmentation), every protocol setting
    (epochs, batch, schedule, early stopping) and every speed setting fixed, on the CPU in fp32."""
    return dataclasses.replace(
        cfg, variant="fingerprint", seed=SEEDS[0], profile="fingerprint", epochs=2, batch_size=EXAMPLES // STEPS, lr=1e-3,
        lr_decay_rate=0.5, lr_decay_steps=1, lr_min=1e-4, lr_schedule_epochs=3, target_accuracy_pct=0.0,
        amp=False, compile=False, deterministic=True, log_every=1, eval_batch_size=EXAMPLES, device="cpu",
        checkpoint_every=2, multimnist_epoch_size=EXAMPLES, channels_last=False, compile_mode="default",
        stack_layout="fused", cuda_graph=False)


def weights_digest(models: list[torch.nn.Module]) -> str:
    """SHA-256 over every model's parameters and buffers (name, shape, dtype, bytes), in order."""
    digest = hashlib.sha256()
    for k, model in enumerate(models):
        for name, tensor in sorted(model.state_dict().items()):
            tensor = tensor.detach().cpu().contiguous()
            digest.update(f"{k}.{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
            digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def training_fingerprint(cfg: RunConfig) -> str:
    """The first 16 hex digits of the fingerprint of ``cfg``'s training code (see the module)."""
    try:
        return _fingerprint(fingerprint_config(cfg))
    except FingerprintError as err:
        raise FingerprintError(f"{cfg.variant}: {err}") from None


@functools.lru_cache(maxsize=None)  # the code cannot change within a process
def _fingerprint(small: RunConfig) -> str:
    return in_capped_process([small])["fingerprints"][0]


def scratch() -> Path | None:
    """Where the fingerprint's checkpoint goes: in memory where Linux offers a /dev/shm with room for it
    (a container's may hold 64 MB), else the temporary folder's default."""
    return SCRATCH if SCRATCH.is_dir() and shutil.disk_usage(SCRATCH).free >= SCRATCH_BYTES else None


def _compute(small: RunConfig) -> str:
    """The fingerprint of ``small``, computed in this process (`main`, under `CAPPED`)."""
    cfgs = [dataclasses.replace(small, seed=s) for s in SEEDS]
    with torch.random.fork_rng(devices=[]), one_thread(), tempfile.TemporaryDirectory(dir=scratch()) as tmp, \
            contextlib.redirect_stdout(io.StringIO()):  # the caller's random streams and output untouched
        torch.manual_seed(0)  # the synthetic digits, the same for every run
        data = small.experiment_module().synthetic_data(small, EXAMPLES, torch.device("cpu"))
        try:
            results = train_group(cfgs, data, Path(tmp) / "fingerprint.pt", state=None)
        except NonFiniteLossError as err:  # its message's "last good checkpoint" is in a folder now gone
            raise NonFiniteLossError(f"{str(err).partition('; ')[0]} of the fingerprint's few CPU steps") from None
    return weights_digest([r.model for r in results])[:16]


_ENVIRONMENT: list[str] = []  # what the capped processes reported, once one ran


def capped_env(caps: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment under `CAPPED` (or ``caps``), with this checkout's code first on
    the import path: what every capped process runs in (also scripts/fingerprint_trace.py's)."""
    root = str(Path(__file__).resolve().parents[2])
    return os.environ | (CAPPED if caps is None else caps) | {
        "PYTHONPATH": os.pathsep.join(dict.fromkeys([root, *filter(None, sys.path)]))}


def in_capped_process(smalls: list[RunConfig], caps: dict[str, str] | None = None) -> dict:
    """{"fingerprints": each of ``smalls``' fingerprints, "environment": `fingerprint_environment`},
    computed by `python -m pipeline.training.fingerprint` under `CAPPED` (or ``caps``: other settings,
    scripts/fingerprint_probe.py) with this checkout's code and this process's import path (an experiment
    `registry.register` added is imported there by name)."""
    env = capped_env(caps)

    def compute() -> dict:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "configs.pkl").write_bytes(pickle.dumps({"configs": smalls, "experiments": registry.plugins()}))
            done = subprocess.run([sys.executable, "-m", __name__, tmp], env=env, capture_output=True, text=True)
            if done.returncode != 0:
                why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
                raise FingerprintError(f"the training fingerprint failed in its CPU process: {why}")
            return json.loads((Path(tmp) / "fingerprints.json").read_text())

    out = fingerprint_cache.cached(smalls, env, compute)  # computed once per code, configuration and environment
    if caps is None:
        _ENVIRONMENT[:] = [out["environment"]]
    return out


def mkl_branch() -> str:
    """The branch MKL's GEMM runs in this process, as MKL reports it ('COMPATIBLE'; 'AUTO' where it set
    aside an MKL_CBWR this processor lacks); 'absent' for a torch built without MKL, 'unreported'
    where its library does not export the query."""
    if not torch.backends.mkl.is_available():
        return "absent"
    try:
        branch = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")).mkl_serv_cbwr_get(1)
    except (OSError, AttributeError):
        return "unreported"
    return MKL_BRANCHES.get(branch, f"branch {branch}")


def host_numerics() -> str:
    """The host beside torch and its caps that fp32 results on the CPU were seen to follow: the
    processor's vendor (/proc/cpuinfo's vendor_id, else the machine's architecture) and the C library
    (its libm), 'AuthenticAMD, glibc 2.36'."""
    vendor = cpuinfo("vendor_id")
    libc, version = platform.libc_ver()
    return f"{vendor or platform.machine() or 'processor unknown'}, {f'{libc} {version}' if libc else 'libc unknown'}"


def fingerprint_environment() -> str:
    """What a fingerprint depends on besides the code: torch's version, the CPU capability and MKL
    branch of its capped process, and `host_numerics`: 'torch 2.15.0+cu132, CPU AVX2 capped, MKL
    COMPATIBLE, AuthenticAMD, glibc 2.36'."""
    return _ENVIRONMENT[0] if _ENVIRONMENT else in_capped_process([])["environment"]


def fingerprint_table(params: Params, variants: list[str], progress=lambda done, variant: None) -> dict[str, str]:
    """Every variant's training fingerprint as this code computes it (what its train stage would record
    under ``params``), a capped process per CPU core at a time, in ``variants``' order;
    ``progress(done, variant)`` as each comes."""
    with ThreadPoolExecutor(max_workers=max(1, min(os.cpu_count() or 1, len(variants)))) as pool:
        running = {pool.submit(training_fingerprint, run_config(params, v, seed=0)): v for v in variants}
        for done, future in enumerate(as_completed(running), start=1):
            future.result()  # its error, naming the variant, before the others'
            progress(done, running[future])
    return {v: future.result() for future, v in running.items()}


def cap_kernels() -> None:
    """The cap's half that a capped process sets itself, first (`capped_env` sets the other before it
    starts): oneDNN off. Every capped process calls it (also scripts/fingerprint_trace.py's)."""
    torch.backends.mkldnn.enabled = False  # oneDNN's blocking follows the processor's caches


def main(folder: str) -> None:
    """The capped process: the fingerprints of the configurations pickled in FOLDER/configs.pkl, and
    the environment they ran in, to FOLDER/fingerprints.json."""
    cap_kernels()
    asked = pickle.loads((Path(folder) / "configs.pkl").read_bytes())
    for name, module in asked["experiments"].items():
        try:
            registry.register(importlib.import_module(module))
        except ImportError as err:
            raise UserError(f"experiment {name!r} was registered from module {module!r}, which a process of its own "
                            f"cannot import ({err}): register an experiment from a module on the import path") from None
    fingerprints = [_compute(s) for s in asked["configs"]]
    (Path(folder) / "fingerprints.json").write_text(json.dumps({"fingerprints": fingerprints,
                                                                "environment": capped_environment()}))


def capped_environment() -> str:
    """`fingerprint_environment` as the capped process itself reads it (also scripts/fingerprint_trace.py's)."""
    return (f"torch {torch.__version__}, CPU {torch.backends.cpu.get_cpu_capability()} capped, MKL {mkl_branch()}, "
            f"{host_numerics()}")


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except Exception as err:  # the traceback, then one line that the caller's error quotes
        traceback.print_exc()
        sys.exit(f"{type(err).__name__}: {first_line(err, 300)}")
