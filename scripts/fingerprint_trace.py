"""Which operation computes differently on two hosts (issue #36)?

    python3 scripts/fingerprint_trace.py OUT.jsonl.gz [--variant capsnet_r3_recon] [--against reports/fingerprint-probe]
    python3 scripts/fingerprint_trace.py --keep FILE reports/fingerprint-probe
    python3 scripts/fingerprint_trace.py --replay reports/fingerprint-probe/HOST-first-difference.pt

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
differs, named with its inputs' shapes. With `--against`, the trace compares itself as it goes with
another host's there (this torch's, this variant's) and keeps the first operation that parts, its inputs
and outputs (whole up to 2 MiB), which `--keep` files beside the trace and `--replay` computes again on
another host, under the cap, saying how many output elements differ and by how many units in the last
place: whether the kernel differs by rounding, and where.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline.core.params import load_params  # noqa: E402
from pipeline.training import fingerprint as fp  # noqa: E402
from pipeline.training.config import run_config  # noqa: E402

HASH_DIGITS = 12
# the first operation that parts from another host's trace: its tensors kept whole up to this many bytes
# (a call's checks come back in one file of at most 16 MiB; git keeps it)
DUMP_BYTES = 2 << 20
FIRST_DIFFERENCE = "first-difference.pt"  # beside the trace: OUT's name, this instead of .jsonl.gz


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
    """Records every ATen operation dispatched inside it: name, inputs' signatures, outputs' hash. Given
    another host's trace (``expected``: its operation lines), it also keeps the first operation that parts
    from it: its inputs and outputs (`operation_record`), to replay elsewhere (`replay`)."""

    def __init__(self, expected: list[dict] | None = None) -> None:
        super().__init__()
        self.ops: list[dict] = []
        self.expected = expected or []
        self.first_difference: dict | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        line = {"op": str(func), "in": [signature(t) for t in tensors((args, kwargs))], "out": outputs_hash(out)}
        k = len(self.ops)
        self.ops.append(line)
        if self.expected and self.first_difference is None and (k >= len(self.expected) or self.expected[k] != line):
            self.first_difference = operation_record(k, func, args, kwargs or {}, out,
                                                     self.expected[k] if k < len(self.expected) else None)
        return out


def operation_record(index: int, func, args, kwargs: dict, out, expected: dict | None) -> dict:
    """One operation as `replay` reads it: its name and place in the trace, what the other trace holds
    there, and its inputs and outputs as this process had them, whole where together they take at most
    DUMP_BYTES, else each tensor's signature and hash alone (``whole``: which)."""
    whole = sum(t.numel() * t.element_size() for t in tensors((args, kwargs, out))) <= DUMP_BYTES

    def kept(x):
        if not isinstance(x, torch.Tensor):
            return x
        return x.detach().clone() if whole else {"signature": signature(x), "hash": outputs_hash(x)}

    return {"index": index, "op": str(func), "expected": expected, "whole": whole,
            "args": tree_map(kept, args), "kwargs": tree_map(kept, kwargs), "out": tree_map(kept, out)}


def trace(variant: str, params_path: Path, against: Path | None = None, dump: Path | None = None) -> list[dict]:
    """A header line ({"variant", "fingerprint", "environment", "host", "cpu", "ops"}), then one line per
    operation, from ``variant``'s fingerprint computation in a capped process of its own; with another
    host's trace ``against``, the first operation that parts from it goes to ``dump`` (`operation_record`,
    torch.save), if one does."""
    small = fp.fingerprint_config(run_config(load_params(params_path), variant, seed=0))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.pkl").write_bytes(pickle.dumps(small))
        if against is not None:
            (Path(tmp) / "expected.json").write_text(json.dumps(read(against)[1:]))
        done = subprocess.run([sys.executable, __file__, "--worker", tmp], env=fp.capped_env(), capture_output=True, text=True)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise fp.FingerprintError(f"the traced fingerprint failed in its CPU process: {why}")
        ops = json.loads((Path(tmp) / "trace.json").read_text())
        if dump is not None and (Path(tmp) / FIRST_DIFFERENCE).exists():
            dump.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(Path(tmp) / FIRST_DIFFERENCE, dump)
    header = ops.pop(0) | {"variant": variant, "host": fp.host_numerics(), "cpu": fp.cpuinfo("model name"), "ops": len(ops)}
    return [header, *ops]


def worker(folder: Path) -> None:
    """The capped process: FOLDER/config.pkl's fingerprint computed under `Trace`, to FOLDER/trace.json
    (and the first operation parting from FOLDER/expected.json, where there is one, to FIRST_DIFFERENCE)."""
    fp.cap_kernels()  # as the fingerprint's own capped process
    small = pickle.loads((folder / "config.pkl").read_bytes())
    expected = folder / "expected.json"
    recorder = Trace(json.loads(expected.read_text()) if expected.exists() else None)
    with recorder:
        fingerprint = fp._compute(small)
    header = {"fingerprint": fingerprint, "environment": fp.capped_environment()}
    (folder / "trace.json").write_text(json.dumps([header, *recorder.ops]))
    if recorder.first_difference is not None:
        torch.save(recorder.first_difference, folder / FIRST_DIFFERENCE)


def first_difference_path(trace_path: Path) -> Path:
    """Where the first operation parting from another host's trace goes beside ``trace_path``:
    OUT.jsonl.gz's is OUT-first-difference.pt."""
    return trace_path.with_name(trace_path.name.removesuffix(".jsonl.gz") + "-" + FIRST_DIFFERENCE)


def reference(folder: Path, variant: str) -> Path | None:
    """The trace in ``folder`` of another host than this one, with this torch and ``variant`` (the first by
    name), to trace against; None where there is none."""
    mine = host_name({"host": fp.host_numerics(), "environment": f"torch {torch.__version__}"})
    for path in sorted(folder.glob(f"*-torch-{torch.__version__}.trace.jsonl.gz")):
        if path.name.removesuffix('.jsonl.gz') != mine and read(path)[0]["variant"] == variant:
            return path
    return None


def replay(record_path: Path) -> str:
    """The recorded operation computed again here, in the capped process, from its recorded inputs: how
    many of its output elements differ from those the recording host computed, and by how many units in
    the last place."""
    done = subprocess.run([sys.executable, __file__, "--replay-worker", str(record_path)], env=fp.capped_env(),
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise fp.FingerprintError(f"the replay failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return done.stdout.strip()


def replay_worker(record_path: Path) -> str:
    """`replay` in the capped process."""
    fp.cap_kernels()
    record = torch.load(record_path, weights_only=False)
    where = f"{record['op']} (#{record['index']} of the trace)"
    if not record["whole"]:
        return f"{where}: its tensors were over {DUMP_BYTES} bytes and were not kept: nothing to replay"
    packet, _, overload = record["op"].removeprefix("aten.").rpartition(".")
    func = getattr(getattr(torch.ops.aten, packet), overload)
    with fp.one_thread():
        here = func(*record["args"], **record["kwargs"])
    parts = []
    for k, (there, mine) in enumerate(zip(tensors(record["out"]), tensors(here))):
        parts.append(f"output {k} {signature(mine)}: {difference(there, mine)}")
    expected = record["expected"]
    same = expected is not None and outputs_hash(here) == expected["out"]
    return (f"{where}: " + "; ".join(parts) + f"; here it computes {'what' if same else 'other than what'} this "
            f"host's trace holds there")


def difference(there: torch.Tensor, here: torch.Tensor) -> str:
    """How two tensors of one signature differ: elements, largest absolute difference, units in the last place."""
    if torch.equal(there, here):
        return "the same"
    differs = (there != here) & ~(there.isnan() & here.isnan()) if there.is_floating_point() else there != here
    out = f"{int(differs.sum())} of {there.numel()} elements differ"
    if there.dtype == torch.float32:
        a, b = there[differs], here[differs]
        ulps = (a.view(torch.int32).long() - b.view(torch.int32).long()).abs()[(a < 0) == (b < 0)]
        out += f", by at most {float((a - b).abs().max()):.3g}" + (f" ({int(ulps.max())} ulp)" if ulps.numel() else "")
    return out


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
    """``source`` filed in ``folder`` under its host's name, and where it parts from every other host's trace
    there; the first operation that parted on its host (FIRST_DIFFERENCE beside it), filed beside it."""
    lines = read(source)
    if not lines:
        return [f"{source} holds no trace"]
    dest = folder / f"{host_name(lines[0])}.jsonl.gz"
    write(dest, lines)
    out = [f"fingerprint trace of {lines[0]['cpu']} ({lines[0]['host']}, {lines[0]['ops']} operations) kept in {dest}"]
    for other in sorted(folder.glob("*.trace.jsonl.gz")):
        if other != dest:
            out += [f"  against {other.name.removesuffix('.trace.jsonl.gz')}: {first_difference(read(other), lines)}"]
    dumped = first_difference_path(source)
    if dumped.exists():
        kept = folder / f"{host_name(lines[0])}-{FIRST_DIFFERENCE}"
        shutil.copyfile(dumped, kept)
        out += [f"  its first operation parting from the trace it ran against, inputs and outputs, kept in {kept}: "
                f"`python3 scripts/fingerprint_trace.py --replay {kept}` computes it again here (under that torch)"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, help="where the trace goes (gzipped JSON lines)")
    parser.add_argument("--variant", default="capsnet_r3_recon")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--against", type=Path, metavar="FOLDER",
                        help="trace against another host's trace of this torch there; the first operation that "
                             "parts from it goes beside OUT (OUT-first-difference.pt)")
    parser.add_argument("--keep", nargs=2, type=Path, metavar=("FILE", "FOLDER"),
                        help="file a window's trace under its host's name, compared with the other hosts' there")
    parser.add_argument("--replay", type=Path, metavar="FILE", help="compute a kept first difference again here")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--replay-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
    elif args.replay_worker:
        print(replay_worker(args.replay_worker))
    elif args.replay:
        print(replay(args.replay))
    elif args.keep:
        print("\n".join(keep(*args.keep)))
    elif args.out is None:
        parser.error("name the file the trace goes to (OUT.jsonl.gz), or --keep FILE FOLDER, or --replay FILE")
    else:
        against = reference(args.against, args.variant) if args.against else None
        if args.against and against is None:
            print(f"no other host's trace of {args.variant} under torch {torch.__version__} in {args.against}: "
                  "traced without comparing")
        dump = first_difference_path(args.out)
        dump.unlink(missing_ok=True)
        lines = trace(args.variant, args.params, against, dump)
        write(args.out, lines)
        parted = f"; the first operation parting from {against.name} kept in {dump}" if dump.exists() else (
            f"; every operation as {against.name}" if against else "")
        print(f"{args.variant}: {lines[0]['ops']} operations traced, fingerprint {lines[0]['fingerprint']} "
              f"({lines[0]['environment']}){parted}")


if __name__ == "__main__":
    main()
