"""Which operation computes differently on two hosts (issue #36)?

    python3 scripts/fingerprint_trace.py OUT.jsonl.gz [--variant capsnet_r3_recon]
    python3 scripts/fingerprint_trace.py --keep FILE reports/fingerprint-probe

The H200 host's Intel Xeon (glibc 2.39) computes other capped training fingerprints than this AMD
EPYC (glibc 2.36) with one torch build, and no cap the probe turns (scripts/fingerprint_probe.py: MKL's
dispatch, ATen's capability, glibc's libm variants) makes them agree. The fingerprint hashes the weights
at the end, so it cannot say where two hosts part. The trace can: the first form runs one variant's
fingerprint computation in a capped process (the fingerprint's own, `fingerprint.CAPPED`) under a
`TorchDispatchMode` that records every ATen operation it dispatches, in order (the synthetic digits,
the initialisation, every forward, backward and Adam step of the two stacked seeds), with its inputs'
dtypes and shapes and a hash of its outputs, and the fingerprint it computed (the trace changes no
kernel: the test checks that it computes the capped fingerprint). A GPU window runs it beside its CUDA
tests (scripts/gpu_session.sh, about 4,500 operations, 10-20 s of one core) and `gpu_import.sh` files it
in reports/fingerprint-probe/ under its host's name (`--keep`), comparing it with every other host's
there: the first operation whose outputs differ, all before it having agreed, is the kernel that
differs, named with its inputs' shapes.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline.core.params import load_params  # noqa: E402
from pipeline.training import fingerprint as fp  # noqa: E402
from pipeline.training.train import run_config  # noqa: E402

HASH_DIGITS = 12


def tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def outputs_hash(out) -> str:
    """The first HASH_DIGITS hex digits of the SHA-256 over every output tensor's bytes, in order."""
    digest = hashlib.sha256()
    for t in tensors(out):
        t = t.detach()
        digest.update(f"{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            digest.update(t.cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:HASH_DIGITS]


def signature(t: torch.Tensor) -> str:
    """'float32[4, 1152]'."""
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


class Trace(TorchDispatchMode):
    """Records every ATen operation dispatched inside it: name, inputs' signatures, outputs' hash."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[dict] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append({"op": str(func), "in": [signature(t) for t in tensors((args, kwargs))],
                         "out": outputs_hash(out)})
        return out


def trace(variant: str, params_path: Path) -> list[dict]:
    """A header line ({"variant", "fingerprint", "environment", "host", "cpu", "ops"}), then one line per
    operation, from ``variant``'s fingerprint computation in a capped process of its own."""
    small = fp.fingerprint_config(run_config(load_params(params_path), variant, seed=0))
    root = str(Path(__file__).resolve().parents[1])
    env = os.environ | fp.CAPPED | {"PYTHONPATH": os.pathsep.join(dict.fromkeys([root, *filter(None, sys.path)]))}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.pkl").write_bytes(pickle.dumps(small))
        done = subprocess.run([sys.executable, __file__, "--worker", tmp], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise fp.FingerprintError(f"the traced fingerprint failed in its CPU process: {why}")
        ops = json.loads((Path(tmp) / "trace.json").read_text())
    header = ops.pop(0) | {"variant": variant, "host": fp.host_numerics(), "cpu": fp.cpuinfo("model name"), "ops": len(ops)}
    return [header, *ops]


def worker(folder: Path) -> None:
    """The capped process: FOLDER/config.pkl's fingerprint computed under `Trace`, to FOLDER/trace.json."""
    torch.backends.mkldnn.enabled = False  # as the fingerprint's own capped process (fingerprint.main)
    small = pickle.loads((folder / "config.pkl").read_bytes())
    recorder = Trace()
    with recorder:
        fingerprint = fp._compute(small)
    header = {"fingerprint": fingerprint, "environment": fp.capped_environment()}
    (folder / "trace.json").write_text(json.dumps([header, *recorder.ops]))


def first_difference(a: list[dict], b: list[dict]) -> str:
    """Where trace ``b`` parts from trace ``a``: the first operation whose outputs differ (every one before
    it agreeing), or the first where they ran different operations, or that they agree throughout."""
    (head_a, *ops_a), (head_b, *ops_b) = a, b
    if head_a["variant"] != head_b["variant"]:
        return f"not comparable ({head_a['variant']} and {head_b['variant']})"
    if head_a["environment"].split(",")[0] != head_b["environment"].split(",")[0]:
        return f"not comparable ({head_a['environment'].split(',')[0]} and {head_b['environment'].split(',')[0]})"
    for i, (x, y) in enumerate(zip(ops_a, ops_b)):
        if x["op"] != y["op"] or x["in"] != y["in"]:
            return (f"ran other operations from #{i} of {len(ops_a)} ({x['op']} {', '.join(x['in'])} against "
                    f"{y['op']} {', '.join(y['in'])}), all before it computing the same")
        if x["out"] != y["out"]:
            before = ", ".join(op["op"].removeprefix("aten.") for op in ops_a[max(0, i - 3):i]) or "none"
            return (f"first computes differently at #{i} of {len(ops_a)}: {x['op']} ({', '.join(x['in']) or 'no tensors'}), "
                    f"all {i} before it the same (the last: {before})")
    if len(ops_a) != len(ops_b):
        return f"the same for {min(len(ops_a), len(ops_b))} operations, then one trace ends ({len(ops_a)} against {len(ops_b)})"
    same = head_a["fingerprint"] == head_b["fingerprint"]
    return ("every operation computes the same" + ("" if same else f", yet the fingerprints differ "
            f"({head_a['fingerprint']} against {head_b['fingerprint']}): outside the dispatched operations"))


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines() if line.strip()]


def write(path: Path, lines: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # mtime 0: the same trace makes the same file (a re-filed one is no change to commit)
    path.write_bytes(gzip.compress("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines).encode(), mtime=0))


def host_name(header: dict) -> str:
    """The file name the probe gives this host (scripts/fingerprint_probe.py), '.trace.jsonl.gz' after it."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fingerprint_probe import host_name as probe_host_name
    return probe_host_name([header]) + ".trace"


def keep(source: Path, folder: Path) -> list[str]:
    """``source`` filed in ``folder`` under its host's name, and where it parts from every other host's trace there."""
    lines = read(source)
    if not lines:
        return [f"{source} holds no trace"]
    dest = folder / f"{host_name(lines[0])}.jsonl.gz"
    write(dest, lines)
    out = [f"fingerprint trace of {lines[0]['cpu']} ({lines[0]['host']}, {lines[0]['ops']} operations) kept in {dest}"]
    for other in sorted(folder.glob("*.trace.jsonl.gz")):
        if other != dest:
            out += [f"  against {other.name.removesuffix('.trace.jsonl.gz')}: {first_difference(read(other), lines)}"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, help="where the trace goes (gzipped JSON lines)")
    parser.add_argument("--variant", default="capsnet_r3_recon")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--keep", nargs=2, type=Path, metavar=("FILE", "FOLDER"),
                        help="file a window's trace under its host's name, compared with the other hosts' there")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
    elif args.keep:
        print("\n".join(keep(*args.keep)))
    elif args.out is None:
        parser.error("name the file the trace goes to (OUT.jsonl.gz), or --keep FILE FOLDER")
    else:
        lines = trace(args.variant, args.params)
        write(args.out, lines)
        print(f"{args.variant}: {lines[0]['ops']} operations traced, fingerprint {lines[0]['fingerprint']} "
              f"({lines[0]['environment']})")


if __name__ == "__main__":
    main()
