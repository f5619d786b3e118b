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
count: the fingerprint runs on one thread and is recorded with torch's version and the CPU
capability it ran on (`fingerprint_environment`); fingerprints from different environments do
not compare.

A fingerprint covers its run's own model, so two variants' never agree: the report compares two
variants' rows through a commit whose code computed both fingerprints. Runs of one commit share it;
runs of two GPU windows at two commits share one through a *table* (`fingerprint_table`, `capsnet
fingerprint`), every variant's fingerprint as one commit's code computes them, which the GPU
session writes once per window.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import tempfile
from pathlib import Path

import torch

from pipeline.core.params import Params
from pipeline.training.train import RunConfig, run_config, train_group

SEEDS = (0, 1)  # two stacked seeds: the stack's own arithmetic is part of what is fingerprinted
STEPS = 2  # per epoch; two epochs: a new order, the checkpoint written between them
EXAMPLES = 4  # training and test examples; batches of two
# the one checkpoint train_group writes (the baseline's is 280 MB): in memory where Linux offers it
SCRATCH = "/dev/shm" if Path("/dev/shm").is_dir() else None


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
    return _fingerprint(fingerprint_config(cfg))


@functools.lru_cache(maxsize=None)  # the code cannot change within a process
def _fingerprint(small: RunConfig) -> str:
    cfgs = [dataclasses.replace(small, seed=s) for s in SEEDS]
    with torch.random.fork_rng(devices=[]), one_thread(), tempfile.TemporaryDirectory(dir=SCRATCH) as tmp, \
            contextlib.redirect_stdout(io.StringIO()):  # the caller's random streams and output untouched
        torch.manual_seed(0)  # the synthetic digits, the same for every run
        data = small.experiment_module().synthetic_data(small, EXAMPLES, torch.device("cpu"))
        results = train_group(cfgs, data, Path(tmp) / "fingerprint.pt", state=None)
    return weights_digest([r.model for r in results])[:16]


def fingerprint_environment() -> str:
    """What a CPU fingerprint depends on besides the code: torch's version and the CPU kernels' ISA."""
    return f"torch {torch.__version__}, CPU {torch.backends.cpu.get_cpu_capability()}"


def fingerprint_table(params: Params, variants: list[str], progress=lambda done, variant: None) -> dict[str, str]:
    """Every variant's training fingerprint as this code computes it (what its train stage would record
    under ``params``); ``progress(done, variant)`` after each."""
    table = {}
    for k, variant in enumerate(variants):
        table[variant] = training_fingerprint(run_config(params, variant, seed=0))
        progress(k + 1, variant)
    return table

