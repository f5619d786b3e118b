#!/usr/bin/env bash
# Here, after a GPU session (scripts/gpu_session.sh): bring its runs home.
#   bash scripts/gpu_import.sh /work/.device/N      (the device tool's files_at folder)
# Unpacks the newest runs archive there into models/, results/, journal/, logs/ (git-ignored),
# replays the tracking journal into MLflow (mlflow.db or $MLFLOW_TRACKING_URI), copies the compact
# run records into reports/runs/ (committed: no weights), and rewrites the report from them.
set -euo pipefail
folder=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
newest=$(ls "$folder"/runs-*.tar.gz.part-* | sed 's/\.part-.*//' | sort -u | tail -1)
cat "$newest".part-* | tar xzf -
BIN=.venv/bin
$BIN/capsnet track sync journal
$BIN/capsnet publish models results reports/runs
cp params.gpu.yaml reports/runs/params.yaml
cp journal/*.jsonl -t "$(mkdir -p reports/runs/journal && echo reports/runs/journal)"
$BIN/capsnet report reports/runs/models reports/runs/results reports --params reports/runs/params.yaml --missing list
