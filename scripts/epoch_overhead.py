"""What a run spends between its epochs' training, from its tracking journal: the seconds between two
epochs' logged metrics less the later epoch's own training time (`epoch_seconds`), i.e. the test
evaluation after each epoch, its logging and every 5th epoch's checkpoint. The median per published run:
where gpu_queue.py's EPOCH_EVAL_SECONDS comes from.

    python3 scripts/epoch_overhead.py [--runs reports/runs] [--commit fb5b23c]

Needs only this repository's run records (config.json and journal/<run id>.jsonl), not torch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from the repository as a script
from pipeline.core.journal import read_journal  # noqa: E402  (no torch)


def epoch_events(journal: Path) -> list[dict]:
    """The journal's per-epoch metrics events, in order (`read_journal`: a torn last line is skipped)."""
    return [e for e in read_journal(journal) if e.get("event") == "metrics" and "epoch_seconds" in e.get("metrics", {})]


def epoch_overheads(epochs: list[dict]) -> list[float]:
    """Seconds between consecutive epochs' metrics beyond the later epoch's training, one per epoch after the first."""
    return [(b["time_ms"] - a["time_ms"]) / 1000 - b["metrics"]["epoch_seconds"] for a, b in zip(epochs, epochs[1:])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path("reports/runs"))
    parser.add_argument("--commit", default="", help="only runs whose recorded commit starts with this")
    args = parser.parse_args()
    print("variant seed commit median_overhead_s epoch_s")
    for config in sorted(args.runs.glob("models/*/seed*/config.json")):
        record = json.loads(config.read_text())
        commit = str(record.get("environment", {}).get("git_commit", ""))
        journal = args.runs / "journal" / f"{record.get('run_id')}.jsonl"
        if not commit.startswith(args.commit) or not journal.is_file():
            continue
        epochs = epoch_events(journal)
        if len(epochs) < 3:
            continue
        print(config.parent.parent.name, config.parent.name.removeprefix("seed"), commit[:7],
              f"{statistics.median(epoch_overheads(epochs)):.3f}",
              f"{statistics.median(e['metrics']['epoch_seconds'] for e in epochs):.2f}")


if __name__ == "__main__":
    main()
