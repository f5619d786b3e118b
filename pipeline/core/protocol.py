"""What makes two runs the same protocol: one definition for the report, which never pools runs of
two protocols (pipeline.report.runs.Run.protocol_key), and the GPU queue, which trains a seed again
until the published records hold it under the protocol a params file asks for (scripts/gpu_queue.py).

A protocol is the profile, the length (epochs × batch), every learning-rate setting and the
precision the arithmetic ran in. Torch-free: the GPU queue reads it with PyYAML alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

NOT_RECORDED = "not recorded"
PRECISIONS = ("", "fp32", "bf16")  # a variant's own precision ("": its profile's train.amp decides)


def precision(cfg: Mapping, device: str) -> str:
    """The arithmetic a run's settings (a config record, or what a params file plans) ran in on
    ``device``: bf16 autocast where amp was on and the device CUDA (training falls back to fp32
    elsewhere); on CUDA without it, fp32 or TF32 (train.tf32; a record from before the key ran
    cuDNN's convolutions in TF32, torch's default)."""
    if not str(device).startswith("cuda"):
        return "fp32"
    if cfg.get("amp"):
        return "bf16 autocast"
    if "tf32" not in cfg:
        return "fp32, TF32 convolutions (not recorded: torch's default)"
    return "TF32" if cfg["tf32"] else "fp32"


def compressed(cfg: Mapping) -> bool:
    """Whether a run decays a longer schedule than it trains (train.lr_schedule_epochs E compressed
    into its epochs): E 0, unrecorded, or the run's own epochs is the schedule at its own pace."""
    return cfg.get("lr_schedule_epochs", 0) not in (0, cfg["epochs"])


def schedule(cfg: Mapping) -> tuple:
    """Every learning-rate setting (a schedule at its own pace is the same whether lr_schedule_epochs
    is 0, the run's epochs or not recorded)."""
    return tuple(sorted((k, cfg[k]) for k in cfg if k.startswith("lr") and (k != "lr_schedule_epochs" or compressed(cfg))))


def protocol_key(cfg: Mapping, device: str) -> tuple:
    """What makes two runs comparable: profile, epochs, batch, every lr* setting, precision."""
    return cfg.get("profile", NOT_RECORDED), cfg["epochs"], cfg["batch_size"], schedule(cfg), precision(cfg, device)


def device_of(record: Mapping) -> str:
    """The device a run's config.json record says it trained on (resolved, as the train stage wrote it)."""
    return str(record.get("params", {}).get("device", record["config"].get("device", "")))


def recorded(record: Mapping) -> tuple:
    """The protocol_key of a run's config.json record."""
    return protocol_key(record["config"], device_of(record))


def amp_of(own: str, profile_amp: bool) -> bool:
    """Whether a variant trains under bf16 autocast: its own precision (variants.V.precision) where it
    names one (a precision twin, e.g. capsnet_r3_recon_fp32), else its profile's train.amp."""
    return {"fp32": False, "bf16": True}.get(own, bool(profile_amp))


def variant_amp(raw: Mapping, variant: str) -> bool:
    """`amp_of` for ``variant`` of a params mapping as read from YAML."""
    return amp_of(raw["variants"][variant].get("precision", ""), raw["train"].get("amp", False))


def planned(raw: Mapping, variant: str) -> tuple:
    """The protocol_key a params mapping (as read from YAML) trains ``variant`` under; a device left
    to `auto` counts as CUDA (the queue plans GPU windows)."""
    train = raw["train"]
    cfg = {**train, "profile": raw["base"].get("profile", "paper"), "amp": variant_amp(raw, variant),
           "tf32": train.get("tf32", False)}
    device = str(train.get("device", "auto"))
    return protocol_key(cfg, "cuda" if device == "auto" else device)


PRECISION_SEEDS = 3  # the precision check's seeds a side before it decides (#36 item 6)


def bf16_allowed(ci_low: float, ci_high: float, n_seeds: int) -> bool | None:
    """The precision check's rule (#36 item 6) on its effect bf16 − fp32 (capsnet_r3_recon against its fp32
    twin, the same short protocol): True, the paper protocol may train in bf16 autocast, where the 95 %
    seed-aware interval holds 0; False where it does not; None (undecided: the paper protocol trains in
    fp32) without an interval or with fewer than PRECISION_SEEDS seeds a side. One rule for the report,
    which says it, and the GPU queue, which acts on it (scripts/gpu_queue.py reads reports/effects.csv)."""
    if math.isnan(ci_low) or math.isnan(ci_high) or n_seeds < PRECISION_SEEDS:
        return None
    return ci_low <= 0 <= ci_high
