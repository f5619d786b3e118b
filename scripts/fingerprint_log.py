"""Sum a log of training-fingerprint lookups: how many answers a run computed, found or could not cache,
the seconds they cost, and any key computed twice (a cache that failed to share it).

    CAPSNET_FINGERPRINT_LOG=/tmp/fingerprints.jsonl CI=true bash .ci/run
    .venv/bin/python scripts/fingerprint_log.py /tmp/fingerprints.jsonl

Each line is one lookup as pipeline/training/fingerprint_cache.py's `log` wrote it. The lines of the
suite's tests name their test; the others (the smoke's train stages, a `capsnet fingerprint`) are
counted under "no test".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

ANSWERS = ("computed", "found", "not cached")


def read_log(path: Path) -> list[dict]:
    """The log's lookups; a line that is not one (a torn write) is left out and counted on stderr."""
    lookups, torn = [], 0
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
            if entry["answer"] in ANSWERS:
                lookups.append(entry)
                continue
        except (ValueError, KeyError, TypeError):
            pass
        torn += 1
    if torn:
        print(f"{path}: {torn} line(s) that are not a lookup left out", file=sys.stderr)
    return lookups


def named(entry: dict) -> str:
    """A lookup's configurations, or what a lookup without one is: a test's stand-in for the capped process."""
    return " + ".join(entry["families"]) or "(no configuration: a test's stand-in)"


def summary(lookups: list[dict]) -> list[str]:
    """What the lookups cost, as lines of text."""
    by_answer = defaultdict(list)
    for entry in lookups:
        by_answer[entry["answer"]].append(entry)
    computed = by_answer["computed"] + by_answer["not cached"]
    lines = [f"{len(lookups)} lookups: " + ", ".join(
        f"{len(by_answer[a])} {a} ({sum(e['compute_s'] + e['wait_s'] for e in by_answer[a]):.1f} s)" for a in ANSWERS)]
    # a key computed again in another cache folder (a test's own) is no failure to share it, nor is a
    # stand-in's (the cache's own tests compute one again on purpose)
    twice = {k: n for k, n in Counter((e.get("cache"), e["key"]) for e in by_answer["computed"] if e["families"]).items()
             if n > 1}
    lines.append(f"keys computed more than once in one cache folder: {len(twice)}"
                 + "".join(f"\n  {k[:12]} in {cache}: {n} times"
                           for (cache, k), n in sorted(twice.items(), key=str)))
    waits = sorted((e for e in by_answer["found"] if e["wait_s"] >= 1), key=lambda e: -e["wait_s"])
    lines.append(f"found after waiting a second or more for another process computing it: {len(waits)}"
                 + "".join(f"\n  {named(e)}: {e['wait_s']:.1f} s" for e in waits))
    lines.append("computed, the longest first:")
    lines += [f"  {e['compute_s']:6.1f} s  {named(e)}  [{e['answer']}] {e['test'] or 'no test'}"
              for e in sorted(computed, key=lambda e: -e["compute_s"])]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="the file $CAPSNET_FINGERPRINT_LOG named")
    args = parser.parse_args(argv)
    if not args.log.is_file():
        print(f"{args.log}: no such log; set CAPSNET_FINGERPRINT_LOG={args.log} for the run to measure, then run this again",
              file=sys.stderr)
        return 2
    print("\n".join(summary(read_log(args.log))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
