"""Push the objects of these stages' `cache: false` outputs (metrics.json, history.csv) to the
default DVC remote:

    python scripts/cluster/push_uncached.py train@capsnet_r1-0 evaluate@capsnet_r1-0

`dvc push --run-cache` sends a stage's run-cache entry and its cached outputs, not the objects of its
uncached ones (treeverse/dvc#5749, #10497), so `dvc repro --pull` in another clone finds the entry
but not every output, and reruns the stage. The run-cache keeps those objects in the local cache
when the stage runs; this sends them. Runs where dvc is installed (never inside a stage).
"""

import sys

from dvc.repo import Repo


def main(targets: list[str]) -> int:
    with Repo() as repo:
        objs = {out.hash_info for target in targets for stage in repo.stage.collect(target)
                for out in stage.outs if not out.use_cache and out.hash_info}
        missing = [h for h in objs if not repo.cache.local.exists(h.value)]
        if missing:
            print(f"error: {len(missing)} uncached output(s) of {', '.join(targets)} are not in the local cache; "
                  "run the stages with the run-cache on (no --no-run-cache)", file=sys.stderr)
            return 1
        result = repo.cloud.push(objs)
        print(f"pushed {len(result.transferred)} of {len(objs)} uncached output object(s) of {', '.join(targets)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
