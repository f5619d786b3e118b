"""The profiles: params.yaml (the paper protocol) plus a few overrides, defined once here.

`make smoke` and `make gpu` hand these to `dvc exp run -S key=value`; a machine without DVC (the
GPU box of scripts/gpu_session.sh) writes the same values into a params file of its own:

    python -m pipeline.profiles gpu --write params.gpu.yaml
    python -m pipeline.profiles smoke --exec dvc exp run      # runs: dvc exp run -S ... -S ...
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

PROFILES: dict[str, dict[str, Any]] = {
    # tiny deterministic subsets, 1 epoch, one seed, CPU; one affNIST-style transform per digit, not 32
    "smoke": {"base.profile": "smoke", "prepare.train_subset": 512, "prepare.test_subset": 256,
              "prepare.affnist_transforms": 1, "train.epochs": 1, "train.batch_size": 32, "train.device": "cpu",
              "train.log_every": 4, "ablation.seeds": [0]},
    # 50 epochs (the length popular re-runs use), 3 seeds, on CUDA: bf16 autocast, model + loss
    # compiled together, cuDNN autotuning instead of deterministic kernels, a checkpoint every 5 epochs
    "gpu": {"base.profile": "gpu", "train.epochs": 50, "train.amp": True, "train.compile": True,
            "train.deterministic": False, "train.device": "cuda", "train.checkpoint_every": 5},
}


def apply(raw: dict, name: str) -> dict:
    """params.yaml's mapping with profile ``name``'s overrides applied (every key must exist)."""
    if name not in PROFILES:
        raise KeyError(f"unknown profile {name!r}; profiles: {', '.join(PROFILES)}")
    out = copy.deepcopy(raw)
    for dotted, value in PROFILES[name].items():
        *path, key = dotted.split(".")
        section = out
        for part in path:
            section = section[part]
        if key not in section:
            raise KeyError(f"profile {name}: {dotted} is not a key of params.yaml")
        section[key] = value
    return out


def dvc_set_args(name: str) -> list[str]:
    """`-S key=value` arguments for `dvc exp run` (values in YAML/JSON flow syntax)."""
    args = []
    for dotted, value in PROFILES[name].items():
        args += ["-S", f"{dotted}={value if isinstance(value, str) else json.dumps(value)}"]
    return args


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.profiles", description=__doc__.splitlines()[0])
    parser.add_argument("profile", choices=sorted(PROFILES))
    parser.add_argument("--params", default="params.yaml", help="the base params file")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", metavar="PATH", help="write params with the profile applied to PATH")
    group.add_argument("--exec", nargs=argparse.REMAINDER, metavar="CMD", help="run CMD followed by -S key=value ...")
    args = parser.parse_args(argv)
    if args.write:
        raw = yaml.safe_load(Path(args.params).read_text())
        Path(args.write).write_text(f"# {args.params} with profile {args.profile} (pipeline/profiles.py)\n"
                                    + yaml.safe_dump(apply(raw, args.profile), sort_keys=False))
        return
    if not args.exec:
        parser.error("--exec needs a command")
    command = args.exec + dvc_set_args(args.profile)
    print(" ".join(command), flush=True)
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
