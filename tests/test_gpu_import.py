"""scripts/gpu_import.sh and bench_table.py here, after a window: each call's archive brought home, the
report rewritten from it, measured jobs kept once per GPU model, and the bench tables the report prices
seeds with."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from conftest import REPO, bench_table


def test_the_import_reads_a_calls_checks_from_their_archive_and_from_an_older_calls_loose_files(tmp_path):
    script = (REPO / "scripts" / "gpu_import.sh").read_text()
    fragment = script[script.index("n=0\nfor folder in"):]
    fragment = fragment[:fragment.index("\ndone\n") + 6]
    new, old = tmp_path / "1", tmp_path / "2"
    new.mkdir(), old.mkdir()
    (tmp_path / "fingerprint_pins.txt").write_text("...\n5 passed in 90s\n")
    with tarfile.open(new / "checks.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "fingerprint_pins.txt", arcname="fingerprint_pins.txt")
    (old / "fingerprint_pins.txt").write_text("1 failed in 80s\n")
    done = subprocess.run(["bash", "-c", f"folders=({new} {old}); BIN=/nowhere\n{fragment}"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.stdout.splitlines() == [f"fingerprint pins on the GPU host's CPU ({new}): 5 passed in 90s",
                                        f"fingerprint pins on the GPU host's CPU ({old}): 1 failed in 80s"], done.stdout + done.stderr
    assert [p.name for p in new.iterdir()] == ["checks.tar.gz"]  # the device tool's folders are read-only: unpacked elsewhere


# the tools gpu_import.sh calls, each logging its call: `capsnet publish` makes its folder, `capsnet report`
# writes a metrics file and ablation.md; `python -m pipeline.profiles NAME --write PATH` writes "profile NAME";
# `python -c CODE FILE…` (lineage.keep_tables) logs its files
IMPORT_CAPSNET = """#!/bin/sh
echo "capsnet $*" >>calls.log
if [ "$1" = publish ]; then mkdir -p "$4"; fi
if [ "$1" = report ]; then
  mkdir -p "$4/metrics" && echo {} >"$4/metrics/capsnet_r1.json" && echo "# written" >"$4/ablation.md"
fi
"""


IMPORT_PYTHON = """#!/bin/sh
case "$1" in
  -m) echo "python $*" >>calls.log; echo "profile $3" >"$5" ;;
  -c) shift 2; echo "keep_tables $*" >>calls.log ;;
  *) echo "python $*" >>calls.log ;;
esac
"""


def window_archive(folder: Path, stamp: str, files: dict[str, str]) -> None:
    """A call's runs archive as gpu_session.sh leaves it: runs-STAMP.tar.gz split in parts."""
    import io

    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    half = len(data.getvalue()) // 2
    for part, chunk in (("aa", data.getvalue()[:half]), ("ab", data.getvalue()[half:])):
        (folder / f"runs-{stamp}.tar.gz.part-{part}").write_bytes(chunk)


def test_the_import_brings_each_folders_newest_archive_home_and_rewrites_the_report_from_it(tmp_path):
    """scripts/gpu_import.sh end to end, its tools stubbed: each folder's newest archive (a warm machine's
    are cumulative) joined from its parts; models and results where the stages write them; the journal
    replayed and kept; the runs published; the profile's params written (CAPSNET_GPU_PROFILE's for a
    rehearsal); bench rows and measured jobs under the GPU model; fingerprint tables kept; the report
    written fresh over reports/, its stale metrics gone; each call's account, CUDA tests' log and pins."""
    work = tmp_path / "work"
    (work / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "gpu_import.sh", work / "scripts")
    (work / "scripts" / "gpu_travel.py").write_text('print("the next window sends 3 MiB")\n')
    (work / ".venv" / "bin").mkdir(parents=True)
    for name, stub in (("capsnet", IMPORT_CAPSNET), ("python", IMPORT_PYTHON)):
        (work / ".venv" / "bin" / name).write_text(stub)
        (work / ".venv" / "bin" / name).chmod(0o755)
    (work / "reports" / "metrics").mkdir(parents=True)
    (work / "reports" / "metrics" / "renamed_row.json").write_text("{}")
    first, second = tmp_path / "device" / "1", tmp_path / "device" / "2"
    first.mkdir(parents=True), second.mkdir()
    window_archive(first, "20261201T090000", {"models/capsnet_r1/seed0/config.json": "older",
                                               "models/capsnet_r1/seed9/config.json": "older"})
    window_archive(first, "20261201T093000", {
        "models/capsnet_r1/seed0/config.json": "newest", "results/capsnet_r1/seed0/metrics.json": "{}",
        "journal/a.jsonl": "{}\n", "logs/bench/.device": "nvidia-h200\n", "logs/bench/capsnet_r1@bf16#1.jsonl": "{}\n",
        "logs/jobs/seconds.jsonl": '{"job": 1}\n', "fingerprints/abc1234-env.json": "{}"})
    window_archive(second, "20261201T110000", {
        "models/baseline_cnn/seed0/config.json": "cnn", "results/baseline_cnn/seed0/metrics.json": "{}",
        "journal/b.jsonl": "{}\n"})
    (first / "session.log").write_text("12:20:01 call starts\n[plan] window 420 s, plan 380 s\n...\n"
                                       "12:31:05 session done\n")
    checks = {"gpu_tests.key": "key\n", "gpu_tests.txt": "9 passed\n", "fingerprint_pins.txt": "5 passed\n"}
    with tarfile.open(first / "checks.tar.gz", "w:gz") as tar:
        for name, text in checks.items():
            (tmp_path / name).write_text(text)
            tar.add(tmp_path / name, arcname=name)
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    done = subprocess.run(["bash", "scripts/gpu_import.sh", str(first), str(second)], cwd=work, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = (work / "calls.log").read_text().splitlines()
    assert calls[:4] == ["capsnet track sync .gpu-import/journal",
                         "capsnet publish .gpu-import/models .gpu-import/results reports/runs",
                         "python -m pipeline.profiles gpu --write reports/runs/params.yaml",
                         "keep_tables .gpu-import/fingerprints/abc1234-env.json"]
    fresh = calls[4].split()[4]
    assert calls[4] == (f"capsnet report reports/runs/models reports/runs/results {fresh} "
                        "--params reports/runs/params.yaml --missing list --readme README.md "
                        "--fingerprints reports/runs/fingerprints --benchmarks reports/benchmarks.md")
    assert Path(fresh).parent.parent == tmp_path / "tmp" and not Path(fresh).parent.exists()  # removed once copied
    assert calls[5:] == ["python scripts/gpu_proof.py keep .gpu-import/checks-1/gpu_tests.key "
                         ".gpu-import/checks-1/gpu_tests.txt reports/bench"]
    assert (work / "models" / "capsnet_r1" / "seed0" / "config.json").read_text() == "newest"
    assert not (work / "models" / "capsnet_r1" / "seed9").exists()  # only in the older archive of that call
    assert (work / "models" / "baseline_cnn" / "seed0" / "config.json").read_text() == "cnn"
    assert (work / "results" / "capsnet_r1" / "seed0" / "metrics.json").exists()
    assert sorted(p.name for p in (work / "reports" / "runs" / "journal").iterdir()) == ["a.jsonl", "b.jsonl"]
    assert (work / "reports" / "runs" / "params.yaml").read_text() == "profile gpu\n"
    bench = work / "reports" / "bench" / "nvidia-h200"
    assert (bench / "capsnet_r1@bf16#1.jsonl").exists()
    assert (bench / "jobs" / "seconds.jsonl").read_text() == '{"job": 1}\n'
    assert sorted(p.name for p in (work / "reports" / "metrics").iterdir()) == ["capsnet_r1.json"]
    assert (work / "reports" / "ablation.md").read_text() == "# written\n"
    assert done.stdout.splitlines() == [
        "bench rows kept in reports/bench/nvidia-h200",
        "1 measured job(s) kept in reports/bench/nvidia-h200/jobs/seconds.jsonl",
        f"call 1 ({first}): [plan] window 420 s, plan 380 s; the session ended at 12:31:05",
        f"fingerprint pins on the GPU host's CPU ({first}): 5 passed",
        "the next window sends 3 MiB"]
    (work / "calls.log").unlink()
    rehearsal = subprocess.run(["bash", "scripts/gpu_import.sh", str(second)], cwd=work,
                               env=env | {"CAPSNET_GPU_PROFILE": "smoke"}, capture_output=True, text=True)
    assert rehearsal.returncode == 0, rehearsal.stderr
    assert "python -m pipeline.profiles smoke --write reports/runs/params.yaml" in (work / "calls.log").read_text()
    assert sorted(p.name for p in (work / ".gpu-import" / "models").iterdir()) == ["baseline_cnn"]  # staged afresh
    usage = subprocess.run(["bash", "scripts/gpu_import.sh"], cwd=work, capture_output=True, text=True)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: ")


def test_the_import_keeps_each_measured_job_once_per_gpu_model(tmp_path):
    """gpu_import.sh adds a window's measured jobs (logs/jobs/seconds.jsonl) to reports/bench/<model>/jobs/:
    the window began from a copy of those kept, which are not added again, nor on a second import."""
    script = (REPO / "scripts" / "gpu_import.sh").read_text()
    fragment = script[script.index("if [ -s .gpu-import/logs/bench/.device ] && [ -s .gpu-import/logs/jobs"):]
    fragment = fragment[:fragment.index("\nfi\n") + 4]
    logs = tmp_path / ".gpu-import" / "logs"
    (logs / "bench").mkdir(parents=True)
    (logs / "bench" / ".device").write_text("nvidia-h200\n")
    kept = tmp_path / "reports" / "bench" / "nvidia-h200" / "jobs" / "seconds.jsonl"
    kept.parent.mkdir(parents=True)
    kept.write_text('{"a": 1}\n')
    (logs / "jobs").mkdir()
    (logs / "jobs" / "seconds.jsonl").write_text('{"a": 1}\n{"b": 2}\n{"c": 3}\n')
    for added in ("2", "0"):
        done = subprocess.run(["bash", "-c", fragment], cwd=tmp_path, capture_output=True, text=True, check=True)
        assert done.stdout.startswith(f"{added} measured job(s) kept in reports/bench/nvidia-h200/jobs/seconds.jsonl")
    assert kept.read_text() == '{"a": 1}\n{"b": 2}\n{"c": 3}\n'


def test_the_bench_table_is_what_the_report_prices_seeds_with(tmp_path):
    """scripts/bench_table.py: one-seed rows in the form pipeline/report/costs.py reads (the variant's
    own row of the configuration a run trained with), stacked rows where the costs do not read them,
    and issue #36's targets marked from the best row of capsnet_r3_recon."""
    from pipeline.report import costs

    common = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-12-01", "commit": "abc1234", "torch": "2.11.0+cu130",
              "batch": 128, "flop_per_image_train": 1.2e9}
    kept = [{**common, "variant": "capsnet_r3_recon", "mode": "bf16-compile", "seeds": 1, "train_images_per_s": 80_000},
            {**common, "variant": "capsnet_r3_recon", "mode": "bf16-compile-capture", "seeds": 1,
             "train_images_per_s": 70_000, "captured": False},
            {**common, "variant": "capsnet_r3_recon", "mode": "bf16-compile", "seeds": 3, "stack": "bmm",
             "train_images_per_s": 140_000, "speedup_vs_separate": 1.75},
            {**common, "variant": "baseline_cnn", "mode": "bf16", "seeds": 1, "train_images_per_s": 30_000},
            {**common, "variant": "baseline_cnn", "mode": "bf16-capture", "seeds": 1, "train_images_per_s": 33_000,
             "captured": True}]
    folder = tmp_path / "nvidia-h100-80gb-hbm3"
    folder.mkdir()
    (folder / "a.jsonl").write_text("\n".join(json.dumps(r) for r in kept[:2]) + "\n")
    (folder / "b.jsonl").write_text("\n".join(json.dumps(r) for r in kept[2:]) + "\ntorn")
    out = bench_table(folder)
    (tmp_path / "benchmarks.md").write_text("# Benchmarks\n\n" + out)
    rows = costs.bench_rows(tmp_path / "benchmarks.md")
    assert {(r.variant, r.images_per_s) for r in rows} == {("capsnet_r3_recon", 80_000), ("capsnet_r3_recon", 70_000),
                                                          ("baseline_cnn", 30_000), ("baseline_cnn", 33_000)}  # never the stacked aggregate
    device = "NVIDIA H100 80GB HBM3"
    assert costs.speed(rows, "capsnet_r3_recon", device, {"amp": True, "compile": True}).images_per_s == 80_000
    assert costs.speed(rows, "baseline_cnn", device, {"amp": True, "compile": False}).images_per_s == 30_000
    captured = {"amp": True, "compile": False, "cuda_graph": True, "compile_mode": "default"}  # as a run records it
    assert costs.speed(rows, "baseline_cnn", device, captured).images_per_s == 33_000  # its own mode's row
    assert costs.speed(rows, "capsnet_r3_recon", device, {**captured, "compile": True}) is None  # that row ran uncaptured
    assert "(ran uncaptured)" in out and "commit abc1234, torch 2.11.0+cu130" in out
    assert "| stacked bf16 + compile (model+loss) | 3 | bmm | 140,000 | – | 1.75 |" in out
    assert "- 1 seed ≥ 75,000 images/s: **reached**, 80,000 (bf16 + compile (model+loss))" in out
    assert "- 3 seeds stacked ≥ 150,000 images/s: **missed**, 140,000 (bf16 + compile (model+loss), bmm)" in out
    empty = subprocess.run([sys.executable, "scripts/bench_table.py", str(tmp_path / "none")], cwd=REPO,
                           capture_output=True, text=True)
    assert empty.returncode != 0 and "holds no bench rows" in empty.stderr and "gpu_import.sh" in empty.stderr


def test_the_bench_table_names_each_rows_levers_keeps_its_last_bench_and_marks_targets_from_its_own_rows(tmp_path):
    """scripts/bench_table.py: a heading with every device, date and batch the rows name; each mode by its
    levers (fp32 or bf16, NHWC, capture), "ran uncaptured" only for a captured mode that did not capture;
    an entry benched twice shows its last row, two stacked seed counts of one layout each theirs; the
    reference row by its name; a target only from capsnet_r3_recon's own modes, reached at equality."""
    common = {"device": "NVIDIA H100 80GB HBM3", "commit": "abc1234", "torch": "2.11.0", "batch": 128,
              "flop_per_image_train": 1.2e9, "variant": "capsnet_r3_recon", "seeds": 1}
    rows = [{**common, "date": "2026-12-02", "mode": "reference", "train_images_per_s": 90_000,
             "speedup_vs_reference": 1.0},
            {**common, "date": "2026-12-01", "mode": "bf16-cl", "train_images_per_s": 50_000, "ms_per_step": 1.234,
             "speedup_vs_reference": 2.5},
            {**common, "date": "2026-12-01", "mode": "bf16-cl", "train_images_per_s": 75_000},  # benched again
            {**common, "date": "2026-12-01", "mode": "capture", "train_images_per_s": 40_000, "captured": True},
            {**common, "date": "2026-12-01", "mode": "bf16", "train_images_per_s": 20_000},
            {**common, "date": "2026-12-01", "mode": "bf16", "seeds": 2, "stack": "bmm", "train_images_per_s": 60_000},
            {**common, "date": "2026-12-01", "mode": "bf16", "seeds": 3, "stack": "bmm", "train_images_per_s": 61_000},
            {**common, "date": "2026-12-01", "mode": "bf16", "seeds": 2, "train_images_per_s": 62_000},  # no layout
            {**common, "date": "2026-12-01", "variant": "baseline_cnn", "mode": "bf16", "train_images_per_s": 99_000,
             "batch": 100}]
    folder = tmp_path / "nvidia-h100-80gb-hbm3"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = bench_table(folder)
    lines = out.splitlines()
    assert lines[0] == "## GPU: one NVIDIA H100 80GB HBM3 (device tool, 2026-12-01, 2026-12-02)"
    assert "(gpu profile, batch 100, 128)" in out and "### capsnet_r3_recon (1.20 GFLOP per training image)" in lines
    assert "| reference (eager fp32, DataLoader) | 90,000 | – | – | – | – | – | 1.00 |" in lines
    assert "| capsnet-repro bf16-cl: bf16, NHWC convolutions | 75,000 | – | – | – | – | – | – |" in lines
    assert "| 50,000 |" not in out and "(ran uncaptured)" not in out
    captured = "capsnet-repro capture: fp32, the whole step as one CUDA graph"
    assert f"| {captured} | 40,000 | – | – | – | – | – | – |" in lines
    assert [line.split(" | ")[1:4] for line in lines if line.startswith("| stacked bf16")] == [
        ["2", "bmm", "60,000"], ["3", "bmm", "61,000"], ["2", "fused", "62,000"]]
    assert "- 1 seed ≥ 75,000 images/s: **reached**, 75,000 (bf16-cl: bf16, NHWC convolutions)" in lines
    assert "- 3 seeds stacked ≥ 150,000 images/s: **missed**, 61,000 (bf16 autocast, bmm)" in lines
    one = [{**common, "date": "2026-12-01", "mode": "bf16-cl", "train_images_per_s": 70_000, "ms_per_step": 1.234,
            "speedup_vs_reference": 2.5}]
    (folder / "a.jsonl").write_text(json.dumps(one[0]) + "\n")
    out = bench_table(folder).splitlines()
    assert "| capsnet-repro bf16-cl: bf16, NHWC convolutions | 70,000 | 1.23 | – | – | – | – | 2.50 |" in out
    assert "- 3 seeds stacked ≥ 150,000 images/s: not measured" in out


def test_the_import_unpacks_a_window_where_no_gpu_call_carries_it():
    """gpu_import.sh unpacks a window's archives outside the carried .gpu, in a folder git ignores: a
    staging copy inside .gpu (the 2026-11-27 import left 6 MB there) would travel with every later call."""
    import re

    staged = re.search(r"rm -rf (\S+) && mkdir -p \1\n", (REPO / "scripts" / "gpu_import.sh").read_text()).group(1)
    assert not Path(staged).is_relative_to(".gpu")
    ignored = subprocess.run(["git", "check-ignore", "-q", f"{staged}/results/x"], cwd=REPO)
    assert ignored.returncode == 0, f"{staged} is not ignored by git: its files would travel untracked"
