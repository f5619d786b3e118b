#!/usr/bin/env bash
# Which lines of the package the test suite runs (`make coverage`; not part of CI): the suite as `make test`
# runs it, under coverage.py, every Python process it starts measured too (`patch = subprocess`: the xdist
# workers, the CLI and stage processes, the GPU-window scripts' pythons), then one table of the files with
# lines left unrun and which. A missed line is a place to look, not a verdict: CUDA-only branches are
# missed on a CPU; processes a test runs in a copy of the checkout (its DVC and scale-out repositories)
# are not counted, though they ran. What it found the first time: docs/testing.md ("History").
#   bash scripts/coverage.sh [SOURCE ...] [-- PYTEST ARGS]   (SOURCE: folders to measure, default pipeline)
# BIN: the folder of the python to run (default .venv/bin: `make venv` installs coverage with the dev group);
# TEST_WORKERS: pytest's workers, as `make test` counts them unless given.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${BIN:-$PWD/.venv/bin}"
[ -x "$BIN/python" ] || { echo "no $BIN/python: run 'make venv' first" >&2; exit 2; }
sources=() pytest_args=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; pytest_args=("$@"); break; fi
  sources+=("$(realpath "$1")"); shift
done
[ ${#sources[@]} -gt 0 ] || sources=("$PWD/pipeline")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# a forked child ends with os._exit (the warm stage server's): its lines are kept by patching _exit
cat >"$work/rc" <<CONFIG
[run]
parallel = True
data_file = $work/.coverage
source = $(IFS=,; echo "${sources[*]}")
patch = subprocess, _exit, execv
disable_warnings = no-data-collected
CONFIG
workers=${TEST_WORKERS:-$(n=$(nproc 2>/dev/null || echo 2); echo $(( n > 4 ? 4 : n )))}  # make passes its own
status=0
OMP_NUM_THREADS=1 "$BIN/python" -m coverage run --rcfile="$work/rc" -m pytest -n "$workers" --dist loadfile -q \
  -p no:cacheprovider "${pytest_args[@]}" || status=$?
"$BIN/python" -m coverage combine --rcfile="$work/rc" -q
"$BIN/python" -m coverage report --rcfile="$work/rc" --show-missing --skip-covered --sort=miss
[ "$status" -eq 0 ] || echo "coverage: the suite failed (pytest exit $status); the table is of what ran" >&2
exit "$status"
