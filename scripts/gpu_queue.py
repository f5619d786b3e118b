"""The GPU queue (issue #24): every (variant, seed) the published report still lacks under the gpu
profile's protocol, most needed first, as `VARIANT:SEED` words for gpu_session.sh --train.

    python3 scripts/gpu_queue.py [--runs reports/runs] [--params params.gpu.yaml] [--limit N]

A run counts as published when reports/runs/models/VARIANT/seedS/config.json exists and was trained
under the protocol the params give (epochs, batch, every lr* setting, amp): runs of an older protocol
(the 2026-11-23 runs, cut at 50 epochs of the 640-epoch schedule) are queued again, so the next
Table 1 comes from one protocol. Needs only PyYAML (the GPU machine has no DVC or MLflow).
Order: the five Table 1 rows and their four official twins (seed 0 of each first, then 1, then 2),
then MultiMNIST's three variants, then §5.2's two; with --stack one item per variant, its missing
seeds trained stacked in one process (`V:0,1,2`). The paper protocol (640 epochs, `make
paper-gpu`) is not queued: 3 seeds of one variant need about 40 min of H100 time side by side, more
than a session's 30, until seeds train stacked (issue #23).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ORDER = ["capsnet_r3_recon", "capsnet_r3_recon_official", "capsnet_r1_recon", "capsnet_r1_recon_official",
         "capsnet_r3", "capsnet_r3_official", "capsnet_r1", "capsnet_r1_official", "baseline_cnn",
         "multimnist_r3_recon", "multimnist_r1_recon", "multimnist_baseline", "capsnet_affnist", "cnn_affnist"]
SEEDS = (0, 1, 2)
PROTOCOL_KEYS = ("epochs", "batch_size", "lr", "lr_decay_rate", "lr_decay_steps", "lr_min", "lr_schedule_epochs", "amp")


def wanted_protocol(params_path: Path) -> dict:
    """The protocol fields of a params file's train section."""
    train = yaml.safe_load(params_path.read_text())["train"]
    return {k: train.get(k, 0 if k == "lr_schedule_epochs" else None) for k in PROTOCOL_KEYS}


def published(runs: Path, variant: str, seed: int, protocol: dict) -> bool:
    config = runs / "models" / variant / f"seed{seed}" / "config.json"
    if not config.is_file():
        return False
    cfg = json.loads(config.read_text())["config"]
    return all(cfg.get(k, 0 if k == "lr_schedule_epochs" else None) == v for k, v in protocol.items())


def queue(runs: Path, protocol: dict) -> list[str]:
    items = []
    for group in (ORDER[:9], ORDER[9:12], ORDER[12:]):
        items += [f"{v}:{s}" for s in SEEDS for v in group if not published(runs, v, s, protocol)]
    return items


def stacked(items: list[str]) -> list[str]:
    """One word per variant, its missing seeds stacked in one process (`capsnet train V 0,1,2`, issue
    #23), in the order the variants' first items come."""
    seeds: dict[str, list[str]] = {}
    for item in items:
        variant, seed = item.split(":")
        seeds.setdefault(variant, []).append(seed)
    return [f"{v}:{','.join(sorted(s, key=int))}" for v, s in seeds.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path("reports/runs"))
    parser.add_argument("--params", type=Path, default=Path("params.gpu.yaml"))
    parser.add_argument("--limit", type=int, default=0, help="at most this many items (0: all)")
    parser.add_argument("--stack", action="store_true", help="a variant's missing seeds as one stacked item (V:0,1,2)")
    args = parser.parse_args()
    if not args.params.is_file():
        sys.exit(f"{args.params} does not exist: write it with `python -m pipeline.profiles gpu --write {args.params}`")
    items = queue(args.runs, wanted_protocol(args.params))
    if args.stack:
        items = stacked(items)
    print(" ".join(items[:args.limit] if args.limit else items))


if __name__ == "__main__":
    main()
