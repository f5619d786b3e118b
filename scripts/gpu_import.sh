#!/usr/bin/env bash
# Here, after a GPU session (scripts/gpu_session.sh): bring its runs home.
#   bash scripts/gpu_import.sh /work/.device/N [/work/.device/M ...]   (the device tool's files_at folders)
# Unpacks the newest runs archive of each folder, in the order given, into .gpu-import/ (models,
# results, journal, logs; outside .gpu, which every GPU call carries), copies
# its models/ and results/ to where the DVC stages write them, replays the tracking journal into
# MLflow (mlflow.db or $MLFLOW_TRACKING_URI), copies the compact run records of *these* runs (never
# a local smoke run) into reports/runs/ (committed: no weights), the bench rows into reports/bench/<GPU
# model>/ (committed: later windows on that model skip those benches), rewrites the report from them, and
# says what the next window's calls will send against the device tool's 64 MiB (scripts/gpu_travel.py).
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 FOLDER [FOLDER ...] (the device tool's files_at folders)" >&2; exit 2; }
folders=()
for f in "$@"; do folders+=("$(cd "$f" && pwd)"); done
cd "$(dirname "$0")/.."
rm -rf .gpu-import && mkdir -p .gpu-import
# One warm machine's archives are cumulative; naming several folders also merges archives of
# sessions run before gpu_session.sh evaluated into gpu_results/ (whose calls lost metrics.json).
for folder in "${folders[@]}"; do
  newest=$(ls "$folder"/runs-*.tar.gz.part-* | sed 's/\.part-.*//' | sort -u | tail -1)
  cat "$newest".part-* | tar xzf - -C .gpu-import
done
cp -r .gpu-import/models .gpu-import/results .
BIN=.venv/bin
$BIN/capsnet track sync .gpu-import/journal
$BIN/capsnet publish .gpu-import/models .gpu-import/results reports/runs
$BIN/python -m pipeline.profiles "${CAPSNET_GPU_PROFILE:-gpu}" --write reports/runs/params.yaml  # another: a rehearsal
mkdir -p reports/runs/journal && cp .gpu-import/journal/*.jsonl reports/runs/journal/
if [ -s .gpu-import/logs/bench/.device ] && ls .gpu-import/logs/bench/*.jsonl >/dev/null 2>&1; then
  # every finished bench entry, kept per GPU model: later windows on that model skip it (gpu_session.sh)
  bench="reports/bench/$(cat .gpu-import/logs/bench/.device)"
  mkdir -p "$bench" && cp .gpu-import/logs/bench/*.jsonl "$bench/" && echo "bench rows kept in $bench"
fi
if [ -s .gpu-import/logs/bench/.device ] && [ -s .gpu-import/logs/jobs/seconds.jsonl ]; then
  # the jobs the window measured (gpu_queue.py --record), added once each to its GPU model's: they price the
  # next window's jobs (the window started from a copy of the kept ones, which are not added again)
  jobs="reports/bench/$(cat .gpu-import/logs/bench/.device)/jobs/seconds.jsonl"
  mkdir -p "${jobs%/*}" && touch "$jobs"
  before=$(wc -l <"$jobs")
  cat "$jobs" .gpu-import/logs/jobs/seconds.jsonl | awk '!seen[$0]++' >"$jobs.tmp" && mv "$jobs.tmp" "$jobs"
  echo "$(( $(wc -l <"$jobs") - before )) measured job(s) kept in $jobs"
fi
if ls .gpu-import/fingerprints/*.json >/dev/null 2>&1; then  # each window's commit: every variant's fingerprint
  # a table of the same name from another environment (one commit, two hosts) is kept beside it, never replaced
  $BIN/python -c 'import sys; from pathlib import Path; from pipeline.core.lineage import keep_tables
keep_tables([Path(p) for p in sys.argv[1:]], Path("reports/runs/fingerprints"))' .gpu-import/fingerprints/*.json
fi
# written in a fresh folder, then copied over reports/, as tests/test_published.py regenerates it: a figure
# the local prepare stage left in reports/figures (its git-ignored test-set montages) is not linked
fresh=$(mktemp -d)
$BIN/capsnet report reports/runs/models reports/runs/results "$fresh/reports" --params reports/runs/params.yaml --missing list \
  --readme README.md --fingerprints reports/runs/fingerprints --benchmarks reports/benchmarks.md
rm -rf reports/metrics  # the report's own, one file per row: a row renamed or gone leaves no stale file
cp -r "$fresh/reports/." reports/ && rm -rf "$fresh"
n=0
for folder in "${folders[@]}"; do  # the capped fingerprint on another processor: pins of this machine, passed there?
  checks=$folder n=$((n + 1))  # a call's checks come in checks.tar.gz (gpu_session.sh), before 2026-11-28 loose
  # the call's account (gpu_plan.sh): the seconds the window lost before the plan, the plan's, the session's
  [ -s "$folder/session.log" ] && echo "call $n ($folder): $(grep -m1 '^\[plan\]' "$folder/session.log" \
    || echo "no plan recorded"); the session ended at $(tail -1 "$folder/session.log" | cut -d' ' -f1)"
  if [ -s "$folder/checks.tar.gz" ]; then checks=.gpu-import/checks-$n && mkdir -p "$checks" && tar xzf "$folder/checks.tar.gz" -C "$checks"; fi
  # the CUDA tests' log, kept under its code, torch and GPU: a later window at the same code does not run them again
  if [ -s "$checks/gpu_tests.key" ] && [ -s "$checks/gpu_tests.txt" ]; then
    $BIN/python scripts/gpu_proof.py keep "$checks/gpu_tests.key" "$checks/gpu_tests.txt" reports/bench || true
  fi
  [ -s "$checks/fingerprint_pins.txt" ] && echo "fingerprint pins on the GPU host's CPU ($folder): $(tail -1 "$checks/fingerprint_pins.txt")"
  [ -s "$checks/fingerprint_probe.jsonl" ] && $BIN/python scripts/fingerprint_probe.py --keep "$checks/fingerprint_probe.jsonl" reports/fingerprint-probe
  # and where its every operation parts from this AMD EPYC's (the first that computes otherwise: the kernel)
  [ -s "$checks/fingerprint_trace.jsonl.gz" ] && $BIN/python scripts/fingerprint_trace.py --keep "$checks/fingerprint_trace.jsonl.gz" reports/fingerprint-probe
done
travel=0; python3 scripts/gpu_travel.py || travel=$?
[ "$travel" != 1 ] || echo "the next window cannot start until this is mended"
true
