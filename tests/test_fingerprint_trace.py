"""scripts/fingerprint_trace.py: every ATen operation of the capped fingerprint's computation, in order,
with its outputs' hash, and the first one where two hosts' traces part (issue #36: which kernel makes
the H200 host's Intel Xeon compute other fingerprints than this AMD EPYC)."""

import gzip
import json
import subprocess
import sys
import tarfile

import pytest
import torch

from pipeline.core.params import load_params
from pipeline.training import fingerprint as fp
from pipeline.training.config import run_config

from conftest import REPO, script

ft = script("fingerprint_trace")


def test_the_trace_records_each_operations_inputs_and_a_hash_of_its_outputs():
    a = torch.tensor([1.0, 2.0, 3.0])
    recorder = ft.Trace()
    with recorder:
        b = a * 2  # (3,)
        c = torch.cat([b, b.sum().reshape(1)])  # (4,)
    assert [op["op"] for op in recorder.ops] == ["aten.mul.Tensor", "aten.sum.default", "aten.view.default", "aten.cat.default"]
    assert recorder.ops[0]["in"] == ["float32[3]"] and recorder.ops[3]["in"] == ["float32[3]", "float32[1]"]
    assert recorder.ops[0]["out"] == ft.outputs_hash(torch.tensor([2.0, 4.0, 6.0]))
    assert recorder.ops[3]["out"] == ft.outputs_hash(c) == ft.outputs_hash(torch.tensor([2.0, 4.0, 6.0, 12.0]))
    # one unit in the last place of one element is another hash; so is another dtype or shape of the same bytes
    nudged = torch.tensor([2.0, torch.nextafter(torch.tensor(4.0), torch.tensor(5.0)).item(), 6.0])
    assert ft.outputs_hash(nudged) != recorder.ops[0]["out"]
    assert ft.outputs_hash(torch.zeros(2)) != ft.outputs_hash(torch.zeros(2, dtype=torch.int32))
    assert ft.outputs_hash(torch.zeros(2, 2)) != ft.outputs_hash(torch.zeros(4))
    assert len(recorder.ops[0]["out"]) == ft.HASH_DIGITS


def trace_of(outs: list[str], fingerprint="f1", torch_version="torch 2.11.0", host="AuthenticAMD, glibc 2.36",
             ops=("aten.linspace.default", "aten.mul.Tensor", "aten.mm.default", "aten.exp.default")) -> list[dict]:
    header = {"variant": "capsnet_r3_recon", "fingerprint": fingerprint, "host": host, "cpu": "a processor",
              "environment": f"{torch_version}, CPU AVX2 capped, MKL COMPATIBLE, {host}", "ops": len(outs)}
    return [header, *({"op": op, "in": [f"float32[{k}, 2]"], "out": out} for k, (op, out) in enumerate(zip(ops, outs)))]


def test_the_first_operation_computed_otherwise_is_named_with_its_inputs_and_those_before_it():
    here = trace_of(["a", "b", "c", "d"])
    assert ft.first_difference(here, trace_of(["a", "b", "x", "y"], "f2")) == (
        "first computes differently at #2 of 4: aten.mm.default (float32[2, 2]), all 2 before it the same "
        "(the last: linspace.default, mul.Tensor)")
    assert ft.first_difference(here, trace_of(["z", "b", "c", "d"], "f2")).startswith("first computes differently at #0 of 4: aten.linspace")
    assert ft.first_difference(here, trace_of(["a", "b", "c", "d"])) == "every operation computes the same"
    assert ft.first_difference(here, trace_of(["a", "b", "c", "d"], "f2")) == (
        "every operation computes the same, yet the fingerprints differ (f1 against f2): outside the dispatched operations")
    other_ops = trace_of(["a", "b", "c", "d"], ops=("aten.linspace.default", "aten.mul.Tensor", "aten.bmm.default", "aten.exp.default"))
    assert ft.first_difference(here, other_ops).startswith("ran other operations from #2 of 4 (aten.mm.default float32[2, 2] "
                                                          "against aten.bmm.default float32[2, 2])")
    assert ft.first_difference(here, trace_of(["a", "b"])) == "the same for 2 operations, then one trace ends (4 against 2)"
    assert ft.first_difference(here, trace_of(["a", "b", "c", "d"], torch_version="torch 2.15.0")) == \
        "not comparable (torch 2.11.0 and torch 2.15.0)"


def test_a_windows_trace_is_kept_under_its_hosts_name_and_compared_with_every_other_hosts(tmp_path):
    folder = tmp_path / "reports" / "fingerprint-probe"
    ft.write(tmp_path / "amd.jsonl.gz", trace_of(["a", "b", "c", "d"]))
    assert ft.keep(tmp_path / "amd.jsonl.gz", folder) == [
        f"fingerprint trace of a processor (AuthenticAMD, glibc 2.36, 4 operations) kept in "
        f"{folder}/AuthenticAMD-glibc-2.36-torch-2.11.0.trace.jsonl.gz"]
    intel = trace_of(["a", "q", "r", "s"], "f2", host="GenuineIntel, glibc 2.39")
    ft.write(tmp_path / "window" / "fingerprint_trace.jsonl.gz", intel)
    said = ft.keep(tmp_path / "window" / "fingerprint_trace.jsonl.gz", folder)
    assert said == [f"fingerprint trace of a processor (GenuineIntel, glibc 2.39, 4 operations) kept in "
                    f"{folder}/GenuineIntel-glibc-2.39-torch-2.11.0.trace.jsonl.gz",
                    "  against AuthenticAMD-glibc-2.36-torch-2.11.0: first computes differently at #1 of 4: "
                    "aten.mul.Tensor (float32[1, 2]), all 1 before it the same (the last: linspace.default)"]
    assert ft.read(folder / "GenuineIntel-glibc-2.39-torch-2.11.0.trace.jsonl.gz") == intel
    before = (folder / "GenuineIntel-glibc-2.39-torch-2.11.0.trace.jsonl.gz").read_bytes()
    ft.keep(tmp_path / "window" / "fingerprint_trace.jsonl.gz", folder)  # filed again: the same bytes, nothing to commit
    assert (folder / "GenuineIntel-glibc-2.39-torch-2.11.0.trace.jsonl.gz").read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == ["AuthenticAMD-glibc-2.36-torch-2.11.0.trace.jsonl.gz",
                                                       "GenuineIntel-glibc-2.39-torch-2.11.0.trace.jsonl.gz"]


def test_the_import_files_a_calls_trace_from_its_checks(tmp_path):
    """gpu_import.sh: the trace in a call's checks.tar.gz is kept in reports/fingerprint-probe/ and compared."""
    script = (REPO / "scripts" / "gpu_import.sh").read_text()
    fragment = script[script.index("n=0\nfor folder in"):]
    fragment = fragment[:fragment.index("\ndone\n") + 6]
    call = tmp_path / "out-1"
    call.mkdir()
    ft.write(tmp_path / "fingerprint_trace.jsonl.gz", trace_of(["a", "b", "x", "d"], "f2", host="GenuineIntel, glibc 2.39"))
    with tarfile.open(call / "checks.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "fingerprint_trace.jsonl.gz", arcname="fingerprint_trace.jsonl.gz")
    home = tmp_path / "home"
    (home / "reports" / "fingerprint-probe").mkdir(parents=True)
    (home / "scripts").symlink_to(REPO / "scripts")
    ft.write(home / "reports" / "fingerprint-probe" / "AuthenticAMD-glibc-2.36-torch-2.11.0.trace.jsonl.gz",
             trace_of(["a", "b", "c", "d"]))
    done = subprocess.run(["bash", "-c", f"folders=({call}); BIN={sys.executable.rsplit('/', 1)[0]}\n{fragment}"], cwd=home,
                          capture_output=True, text=True)
    assert done.stdout.splitlines()[-1] == ("  against AuthenticAMD-glibc-2.36-torch-2.11.0: first computes differently at "
                                            "#2 of 4: aten.mm.default (float32[2, 2]), all 2 before it the same "
                                            "(the last: linspace.default, mul.Tensor)"), done.stdout + done.stderr
    assert (home / "reports" / "fingerprint-probe" / "GenuineIntel-glibc-2.39-torch-2.11.0.trace.jsonl.gz").exists()


@pytest.mark.parametrize("name", ["AuthenticAMD-glibc-2.36-torch-2.11.0+cu130.trace.jsonl.gz"])
def test_the_committed_reference_trace_is_of_the_pinned_fingerprint(name):
    """This AMD EPYC's trace under torch 2.11 (the GPU machine's), which a window's is compared with, traced
    the fingerprint pinned for that environment."""
    from test_fingerprint import PINNED

    header = json.loads(gzip.decompress((REPO / "reports" / "fingerprint-probe" / name).read_bytes()).decode().splitlines()[0])
    torch_version = header["environment"].split(",")[0].split("+")[0]
    pinned = next(pins for env, pins in PINNED.items() if env.startswith(torch_version + ",") and env.endswith(header["host"]))
    assert header["fingerprint"] == pinned[header["variant"]]


def test_traced_against_another_hosts_trace_the_first_operation_that_parts_is_kept_and_replays(tmp_path):
    """Trace(expected=…) keeps the first operation whose line differs from the other host's, with its inputs
    and outputs as this host had them; replayed here from those inputs, it says which elements differ from
    what the recording host computed and by how many units in the last place."""
    a = torch.tensor([1.0, 2.0, 3.0])
    reference = ft.Trace()
    with reference:
        torch.exp(a * 3).sum()
    there = [dict(line) for line in reference.ops]
    there[0]["out"] = there[1]["out"] = "0" * ft.HASH_DIGITS  # the other host's product computed otherwise, so its exp
    recorder = ft.Trace(there)
    with recorder:
        torch.exp(a * 3).sum()
    record = recorder.first_difference
    assert (record["index"], record["op"], record["expected"], record["whole"]) == (0, "aten.mul.Tensor", there[0], True)
    assert torch.equal(record["args"][0], a) and record["args"][1] == 3 and torch.equal(record["out"], a * 3)
    assert ft.Trace(reference.ops).first_difference is None  # nothing parts from an identical trace
    # as a window would bring it back: its product with the last element one unit in the last place off
    nudged = record["out"].clone()
    nudged[2] = torch.nextafter(nudged[2], torch.tensor(float("inf")))
    torch.save(record | {"out": nudged, "expected": reference.ops[0]}, tmp_path / "first-difference.pt")
    said = ft.replay(tmp_path / "first-difference.pt")  # in a capped process of its own
    assert said == ("aten.mul.Tensor (#0 of the trace): output 0 float32[3]: 1 of 3 elements differ, by at most "
                    "9.54e-07 (1 ulp); here it computes what this host's trace holds there")
    big = ft.operation_record(0, torch.ops.aten.exp.default, (torch.zeros(ft.DUMP_BYTES // 4 + 1),), {}, torch.ones(1), None)
    assert not big["whole"] and big["args"][0] == {"signature": f"float32[{ft.DUMP_BYTES // 4 + 1}]",
                                                   "hash": ft.outputs_hash(torch.zeros(ft.DUMP_BYTES // 4 + 1))}


def test_a_window_traces_unchanged_kernels_against_another_hosts_trace_and_keeps_where_it_parts(tmp_path):
    """The traced capped process computes the capped fingerprint. `--against FOLDER` picks another host's trace of this torch and variant there (never this host's own);
    the capped worker keeps the first operation parting from it, and `keep` files it beside the trace."""
    folder = tmp_path / "probe"
    here = ft.trace("capsnet_r1", REPO / "params.yaml")
    header, ops = here[0], here[1:]
    # the trace changes no kernel: its process computes what the fingerprint's own capped process does, in the
    # environment runs record, and it saw the model's training (convolutions, routing's batched matmuls,
    # their gradients, Adam's updates) one operation at a time
    small = fp.fingerprint_config(run_config(load_params(REPO / "params.yaml"), "capsnet_r1", seed=0))
    assert header["fingerprint"] == fp.in_capped_process([small])["fingerprints"][0]
    assert header["environment"] == fp.fingerprint_environment() and header["host"] == fp.host_numerics()
    assert header["variant"] == "capsnet_r1" and header["ops"] == len(ops) > 1000
    names = {op["op"] for op in ops}
    assert {"aten.convolution.default", "aten.convolution_backward.default"} <= names
    assert any("bmm" in name for name in names) and any("sqrt" in name for name in names)  # routing; Adam's denominator
    assert all(len(op["out"]) == ft.HASH_DIGITS for op in ops)
    doctored = [dict(op) for op in ops]
    doctored[5]["out"] = "f" * ft.HASH_DIGITS
    other = {**here[0], "host": "GenuineIntel, glibc 2.39", "cpu": "another"}
    ft.write(folder / f"{ft.host_name(other)}.jsonl.gz", [other, *doctored])
    ft.write(folder / f"{ft.host_name(here[0])}.jsonl.gz", here)  # this host's own: never its reference
    assert ft.reference(folder, "capsnet_r1") == folder / f"{ft.host_name(other)}.jsonl.gz"
    assert ft.reference(folder, "capsnet_r3_recon") is None
    window = tmp_path / "window"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "fingerprint_trace.py"), str(window / "fingerprint_trace.jsonl.gz"),
                           "--variant", "capsnet_r1", "--against", str(folder)], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    dump = window / "fingerprint_trace-first-difference.pt"
    assert done.stdout.strip().endswith(f"the first operation parting from {ft.host_name(other)}.jsonl.gz kept in {dump}")
    record = torch.load(dump, weights_only=False)
    assert (record["index"], record["op"], record["expected"]) == (5, ops[5]["op"], doctored[5])
    said = ft.keep(window / "fingerprint_trace.jsonl.gz", tmp_path / "kept")
    assert said[-1].startswith(f"  its first operation parting from the trace it ran against, inputs and outputs, kept in "
                               f"{tmp_path / 'kept' / ft.host_name(here[0])}-first-difference.pt")
    assert (tmp_path / "kept" / f"{ft.host_name(here[0])}-first-difference.pt").read_bytes() == dump.read_bytes()


def test_comparing_traces_and_tensors_names_each_way_they_part(tmp_path):
    """first_difference: another variant does not compare, an operation on other inputs is another
    operation, a difference at the first operation has none before it; difference: NaN where both hold
    it is no difference, units in the last place only between numbers of one sign, the largest difference,
    and other dtypes without them; read skips blank lines, write is sorted and stamped 0 (the same trace,
    the same bytes); keep of an empty file says so."""
    here = trace_of(["a", "b", "c", "d"])
    other = [here[0] | {"variant": "capsnet_r1"}, *here[1:]]
    assert ft.first_difference(here, other) == "not comparable (capsnet_r3_recon and capsnet_r1)"
    wider = [here[0], here[1], here[2] | {"in": ["float32[1, 3]"]}, *here[3:]]
    assert ft.first_difference(here, wider).startswith(
        "ran other operations from #1 of 4 (aten.mul.Tensor float32[1, 2] against aten.mul.Tensor float32[1, 3])")
    first = ft.first_difference(here, trace_of(["z", "b", "c", "d"]))
    assert first.endswith("all 0 before it the same (the last: none)")
    nan = float("nan")
    assert ft.difference(torch.tensor([nan, 1.0, 2.0]), torch.tensor([nan, 1.0, 3.0])) == \
        "1 of 3 elements differ, by at most 1 (4194304 ulp)"
    tiny = torch.tensor([1e-45, 1.0])  # the smallest subnormal, either side of zero: no ulp count across signs
    assert ft.difference(tiny, tiny * torch.tensor([-1.0, 1.0])) == "1 of 2 elements differ, by at most 2.8e-45"
    assert ft.difference(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.5, 2.0, 5.0])) == \
        "2 of 3 elements differ, by at most 1 (4194304 ulp)"
    doubles = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert ft.difference(doubles, doubles * torch.tensor([1.0, 1.5], dtype=torch.float64)) == "1 of 2 elements differ"
    ft.write(tmp_path / "t.jsonl.gz", here)
    data = (tmp_path / "t.jsonl.gz").read_bytes()
    assert data[4:8] == b"\0\0\0\0"  # gzip's MTIME
    text = gzip.decompress(data).decode()
    assert text.splitlines()[0] == json.dumps(here[0], sort_keys=True)
    (tmp_path / "blank.jsonl.gz").write_bytes(gzip.compress(text.replace("\n", "\n\n").encode()))
    assert ft.read(tmp_path / "blank.jsonl.gz") == here
    (tmp_path / "empty.jsonl.gz").write_bytes(gzip.compress(b"\n"))
    assert ft.keep(tmp_path / "empty.jsonl.gz", tmp_path / "kept") == [f"{tmp_path / 'empty.jsonl.gz'} holds no trace"]


def test_a_first_difference_keeps_its_operations_tensors_as_they_were_whole_up_to_the_limit():
    """A kept input is a copy (an in-place operation after it does not change it); inputs and outputs
    together at exactly DUMP_BYTES are kept whole, over it (outputs counted) by signature; an operation past
    the other trace's end is the first difference, with nothing expected there."""
    a = torch.tensor([1.0, 2.0])
    record = ft.operation_record(0, torch.ops.aten.mul.Tensor, (a, 2), {}, a * 2, None)
    a.add_(1.0)
    assert torch.equal(record["args"][0], torch.tensor([1.0, 2.0]))
    half = torch.zeros(ft.DUMP_BYTES // 8)  # input and output of the limit's half each
    assert ft.operation_record(0, torch.ops.aten.neg.default, (half,), {}, half, None)["whole"]
    assert not ft.operation_record(0, torch.ops.aten.neg.default, (half,), {}, torch.zeros(ft.DUMP_BYTES // 8 + 1),
                                   None)["whole"]
    reference = ft.Trace()
    with reference:
        torch.tensor([1.0]) * 2
    recorder = ft.Trace(reference.ops)
    with recorder:
        torch.tensor([1.0]) * 2
        torch.tensor([1.0]) * 3
    assert recorder.first_difference["index"] == len(reference.ops) and recorder.first_difference["expected"] is None


def test_a_trace_runs_against_the_first_other_hosts_trace_of_its_torch_and_variant(tmp_path, monkeypatch):
    monkeypatch.setattr(ft.fp, "host_numerics", lambda: "AuthenticAMD, glibc 2.36")
    monkeypatch.setattr(ft.torch, "__version__", "2.11.0")
    for name, variant in (("AMD-x-torch-2.15.0", "capsnet_r3_recon"),  # another torch
                          ("ARM-glibc-2.40-torch-2.11.0", "capsnet_r1"),  # another variant
                          ("AuthenticAMD-glibc-2.36-torch-2.11.0", "capsnet_r3_recon"),  # this host's own
                          ("GenuineIntel-glibc-2.39-torch-2.11.0", "capsnet_r3_recon"),
                          ("Zhaoxin-glibc-2.39-torch-2.11.0", "capsnet_r3_recon")):
        ft.write(tmp_path / f"{name}.trace.jsonl.gz", [trace_of(["a"])[0] | {"variant": variant}])
    intel = tmp_path / "GenuineIntel-glibc-2.39-torch-2.11.0.trace.jsonl.gz"
    assert ft.reference(tmp_path, "capsnet_r3_recon") == intel
    assert ft.reference(tmp_path, "baseline_cnn") is None


def test_a_replay_says_when_nothing_was_kept_and_when_this_host_computes_otherwise(tmp_path, monkeypatch):
    from pathlib import Path

    monkeypatch.setattr(ft.fp, "cap_kernels", lambda: None)  # oneDNN left as it is here (see test_fingerprint)
    assert ft.first_difference_path(Path("out/fingerprint_trace.jsonl.gz")) == Path(
        "out/fingerprint_trace-first-difference.pt")
    a = torch.tensor([1.0, 2.0])
    record = ft.operation_record(4, torch.ops.aten.mul.Tensor, (a, 2), {}, a * 2,
                                 {"op": "aten.mul.Tensor", "in": ["float32[2]"], "out": "0" * ft.HASH_DIGITS})
    torch.save(record, tmp_path / "r.pt")
    assert ft.replay_worker(tmp_path / "r.pt") == ("aten.mul.Tensor (#4 of the trace): output 0 float32[2]: the same; "
                                                   "here it computes other than what this host's trace holds there")
    torch.save(record | {"whole": False}, tmp_path / "big.pt")
    assert ft.replay_worker(tmp_path / "big.pt") == (f"aten.mul.Tensor (#4 of the trace): its tensors were over "
                                                     f"{ft.DUMP_BYTES} bytes and were not kept: nothing to replay")
