"""Every variant's training FLOP per image, counted by torch's FlopCounterMode over one training step
(`pipeline.training.bench.flop_per_image`, forward + backward), as reports/bench/flop_per_image.json
keeps them for the GPU queue (scripts/gpu_queue.py prices a variant nobody timed from the bench row of
one that was, and needs no torch to read them).

    .venv/bin/python scripts/flop_table.py [--params params.yaml] [--out reports/bench/flop_per_image.json]

tests/test_gpu_window.py counts them again and fails when the file is not what the code computes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
OUT = Path("reports/bench/flop_per_image.json")


def count(params_path: Path) -> dict[str, float]:
    """{variant: FLOP per training image} for every variant of params_path, on the CPU."""
    import torch

    from pipeline.core.params import load_params
    from pipeline.training.bench import flop_per_image
    from pipeline.training.config import run_config

    params = load_params(str(params_path))
    out = {}
    for variant in params.variants:
        cfg = run_config(params, variant, 0, profile="bench", epochs=1, batch_size=2, amp=False, compile=False,
                         device="cpu")
        out[variant] = flop_per_image(cfg, torch.device("cpu"), batch=2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    table = count(args.params)
    args.out.write_text(json.dumps({v: round(f) for v, f in sorted(table.items())}, indent=1) + "\n")
    print(f"{len(table)} variants' FLOP per training image written to {args.out}")


if __name__ == "__main__":
    main()
