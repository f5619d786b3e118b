"""Write the fingerprint table of an earlier commit's training code, computed in this checkout's
capped environment, so its published runs carry over to this environment (pipeline.core.lineage).

    python scripts/fingerprint_at.py COMMIT reports/runs/fingerprints/COMMIT-ENV.json [--python PY]

When the fingerprint's environment changes (a new cap, a new torch), runs of an earlier commit recorded
their fingerprints in the old one; the GPU queue and the report compare them with a new table only
through a table of their own commit in the new environment. This checks COMMIT out in a temporary git
worktree, makes its gpu-profile params there (`python -m pipeline.profiles gpu`), and runs its own
`fingerprint_table` with this checkout's `CAPPED` settings: COMMIT's code, this environment. PY
(default: this interpreter) must hold the torch the runs' GPU host ran (scripts/torch_floor.sh makes
.venv-torch-floor, torch 2.11.0). COMMIT must have the capped fingerprint process (a604021 or later).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.training import fingerprint as fp  # noqa: E402  (this checkout's cap and environment)
from pipeline.training.fingerprint_cache import CACHE_ENV  # noqa: E402

CAPPED_SINCE = "a604021"  # the first commit whose fingerprint runs in a capped process of its own
# run inside COMMIT's worktree, with its code: its table under the CAPPED given as argv[1]
AT_COMMIT = """
import json, sys
from pathlib import Path
import pipeline.training.fingerprint as fp
from pipeline.core.params import load_params
if not hasattr(fp, "in_capped_process"):
    sys.exit("this commit predates the capped fingerprint process (a604021): its fingerprints were computed uncapped")
fp.CAPPED = json.loads(sys.argv[1])
params = load_params(Path("params.gpu.yaml"))
table = fp.fingerprint_table(params, json.loads(sys.argv[2]) or list(params.variants))
print(json.dumps({"fingerprints": table, "environment": fp.fingerprint_environment()}))
"""


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout.strip()


def table_at(commit: str, python: str, variants: list[str] = ()) -> dict:
    """COMMIT's fingerprint table (of ``variants``; none: every one its params hold) in this checkout's
    capped environment (see the module)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        git("worktree", "add", "--detach", str(tree), commit)
        try:
            made = subprocess.run([python, "-m", "pipeline.profiles", "gpu", "--write", "params.gpu.yaml"], cwd=tree,
                                  capture_output=True, text=True)
            if made.returncode != 0:
                sys.exit(f"{commit[:7]}'s gpu profile failed: {(made.stderr.strip().splitlines() or ['?'])[-1]}")
            kept = {k: os.environ[k] for k in (CACHE_ENV, "HOME", "XDG_CACHE_HOME") if k in os.environ}  # its cache
            done = subprocess.run([python, "-c", AT_COMMIT, json.dumps(fp.CAPPED), json.dumps(list(variants))], cwd=tree,
                                  capture_output=True, text=True, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", **kept})
        finally:
            git("worktree", "remove", "--force", str(tree))
    if done.returncode != 0:
        sys.exit(f"{commit[:7]}'s fingerprint table failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def environment(python: str) -> str:
    """This checkout's `fingerprint_environment` under ``python``'s torch."""
    code = "from pipeline.training.fingerprint import fingerprint_environment as f; print(f())"
    return subprocess.run([python, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("commit")
    parser.add_argument("out", type=Path)
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose torch computes it")
    parser.add_argument("--variants", nargs="*", default=[], help="only these (default: every variant of its params)")
    args = parser.parse_args()
    args.python = os.path.abspath(args.python)  # the worktree is another folder; a venv's link kept as it is
    try:
        commit = git("rev-parse", "--verify", "--quiet", f"{args.commit}^{{commit}}")
    except subprocess.CalledProcessError:
        sys.exit(f"{args.commit} is no commit of this repository: name one as `git log --oneline` shows it")
    before = subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", CAPPED_SINCE, commit], capture_output=True)
    if before.returncode == 1:  # 0: it has the capped process; 128: a copy without that commit, AT_COMMIT checks
        sys.exit(f"{commit[:7]} predates the capped fingerprint process ({CAPPED_SINCE}): its code computes no table "
                 "under a cap, and its runs' fingerprints stay in their own environment")
    computed = table_at(commit, args.python, args.variants)
    here = environment(args.python)
    # COMMIT's code names the environment its own way (older code without MKL's branch): torch and the
    # ATen cap must agree, the rest is this checkout's reading of the same capped process
    if not here.startswith(computed["environment"].split(", MKL")[0]):
        sys.exit(f"{commit[:7]}'s capped process ran in {computed['environment']!r}, this checkout's in {here!r}")
    table = {"commit": commit, "environment": here, "fingerprints": computed["fingerprints"],
             "computed": f"{commit[:7]}'s code under {git('rev-parse', '--short=7', 'HEAD')}'s cap (scripts/fingerprint_at.py)"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
    print(f"{len(table['fingerprints'])} fingerprint(s) of {commit[:7]} in {here} to {args.out}")


if __name__ == "__main__":
    main()
