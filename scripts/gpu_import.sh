#!/usr/bin/env bash
# Here, after a GPU session (scripts/gpu_session.sh): bring its runs home.
#   bash scripts/gpu_import.sh /work/.device/N      (the device tool's files_at folder)
# Unpacks the newest runs archive there into .gpu/import/ (models, results, journal, logs), copies
# its models/ and results/ to where the DVC stages write them, replays the tracking journal into
# MLflow (mlflow.db or $MLFLOW_TRACKING_URI), copies the compact run records of *these* runs (never
# a local smoke run) into reports/runs/ (committed: no weights), and rewrites the report from them.
set -euo pipefail
folder=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
newest=$(ls "$folder"/runs-*.tar.gz.part-* | sed 's/\.part-.*//' | sort -u | tail -1)
rm -rf .gpu/import && mkdir -p .gpu/import
cat "$newest".part-* | tar xzf - -C .gpu/import
cp -r .gpu/import/models .gpu/import/results .
BIN=.venv/bin
$BIN/capsnet track sync .gpu/import/journal
$BIN/capsnet publish .gpu/import/models .gpu/import/results reports/runs
$BIN/python -m pipeline.profiles gpu --write reports/runs/params.yaml
mkdir -p reports/runs/journal && cp .gpu/import/journal/*.jsonl reports/runs/journal/
$BIN/capsnet report reports/runs/models reports/runs/results reports --params reports/runs/params.yaml --missing list
