"""Stage `report`: Table 1 against the paper, ablation effects with paired bootstrap CIs,
the affine-shifted column, deviations and provenance.

Pure functions over the evaluate stage's outputs; `capsnet report` writes the files. The paper's
numbers come from paper_reference.yaml (cited), never from code or templates.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from safetensors.torch import load_file

MIN_SIGMA = 0.03  # verdict tolerance floor (percentage points)
EFFECTS = [  # (what changes, variant A, variant B): effect = error(A) − error(B)
    ("routing 3 vs 1, with reconstruction", "capsnet_r3_recon", "capsnet_r1_recon"),
    ("routing 3 vs 1, no reconstruction", "capsnet_r3", "capsnet_r1"),
    ("reconstruction on vs off, routing 1", "capsnet_r1_recon", "capsnet_r1"),
    ("reconstruction on vs off, routing 3", "capsnet_r3_recon", "capsnet_r3"),
]


class ReportError(RuntimeError):
    """An input of the report is missing or inconsistent; the message names it."""


def paper_reference() -> dict:
    return yaml.safe_load(resources.files("pipeline").joinpath("paper_reference.yaml").read_text())


@dataclass(frozen=True)
class Run:
    variant: str
    seed: int
    metrics: dict
    config: dict
    history: pd.DataFrame
    test_correct: np.ndarray  # (N,) bool, per test image
    affine_correct: np.ndarray


def load_runs(models_dir: Path, results_dir: Path, variants: list[str], seeds: list[int]) -> list[Run]:
    """Every (variant, seed)'s evaluation; a missing one is an error naming it and its path."""
    runs = []
    for variant in variants:
        for seed in seeds:
            model_dir, result_dir = models_dir / variant / f"seed{seed}", results_dir / variant / f"seed{seed}"
            needed = [result_dir / "metrics.json", result_dir / "predictions.safetensors",
                      model_dir / "config.json", model_dir / "history.csv"]
            missing = [str(p) for p in needed if not p.is_file()]
            if missing:
                raise ReportError(f"variant {variant} seed {seed} has no evaluation: missing {', '.join(missing)}; "
                                  f"run `dvc repro evaluate@{variant}-{seed}`")
            pred = load_file(str(result_dir / "predictions.safetensors"))
            runs.append(Run(
                variant, seed, json.loads((result_dir / "metrics.json").read_text()),
                json.loads((model_dir / "config.json").read_text()), pd.read_csv(model_dir / "history.csv"),
                (pred["test_labels"] == pred["test_preds"]).numpy(),
                (pred["affine_test_labels"] == pred["affine_test_preds"]).numpy()))
    return runs


def verdict(mean: float, paper: float, paper_std: float | None) -> str:
    """`reproduced` within 2σ (σ = max(paper σ, 0.03)), else `better` (lower error) or `not reproduced`."""
    sigma = max(paper_std or 0.0, MIN_SIGMA)
    if abs(mean - paper) <= 2 * sigma + 1e-12:
        return "reproduced"
    return "better" if mean < paper else "not reproduced"


def summarize(runs: list[Run], reference: dict) -> pd.DataFrame:
    """One row per variant: our mean ± std over seeds beside the paper's value, delta and verdict."""
    rows = []
    for variant in dict.fromkeys(r.variant for r in runs):
        mine = [r for r in runs if r.variant == variant]
        errors = [r.metrics["test_error_pct"] for r in mine]
        affine = [r.metrics["affine_test_error_pct"] for r in mine]
        paper = reference["table1"].get(variant, {})
        cfg = mine[0].config["config"]
        mean = float(np.mean(errors))
        row = {
            "variant": variant, "model": cfg["model"], "routing_iterations": cfg["routing_iterations"],
            "reconstruction": cfg["reconstruction"], "n_seeds": len(mine),
            "test_error_mean": mean, "test_error_std": float(np.std(errors, ddof=1)) if len(errors) > 1 else math.nan,
            "test_errors": " ".join(f"{e:.2f}" for e in errors),
            "paper_test_error": paper.get("test_error_pct", math.nan),
            "paper_test_error_std": paper.get("test_error_std") if paper.get("test_error_std") is not None else math.nan,
            "affine_test_error_mean": float(np.mean(affine)),
            "affine_test_error_std": float(np.std(affine, ddof=1)) if len(affine) > 1 else math.nan,
            "n_params": mine[0].metrics["n_params"], "paper_n_params": paper.get("n_params", math.nan),
            "reruns": reference.get("reruns", {}).get(variant, ""),
        }
        row["delta"] = mean - row["paper_test_error"]
        row["verdict"] = (verdict(mean, row["paper_test_error"], paper.get("test_error_std"))
                          if paper else "no paper value")
        rows.append(row)
    return pd.DataFrame(rows)


def paired_bootstrap(errors_a: np.ndarray, errors_b: np.ndarray, n_boot: int = 2000,
                     seed: int = 0) -> tuple[float, float, float]:
    """Difference of error rates (A − B, percentage points) and its 95 % CI.

    errors_a, errors_b: (S, N) 0/1 per seed and test image, paired by seed and image. Images are
    resampled (the same resample across seeds, seeds pooled).
    """
    if errors_a.shape != errors_b.shape:
        raise ReportError(f"paired bootstrap needs equal shapes, got {errors_a.shape} and {errors_b.shape}")
    diff = (errors_a.astype(float) - errors_b.astype(float)).mean(axis=0)  # (N,) per image, seeds pooled
    rng = np.random.default_rng(seed)
    n = diff.shape[0]
    boots = np.array([diff[rng.integers(0, n, n)].mean() for _ in range(n_boot)])  # (n_boot,)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return 100 * diff.mean(), 100 * lo, 100 * hi


def effects(runs: list[Run], reference: dict) -> pd.DataFrame:
    """The paper's ablation effects with our paired bootstrap CIs."""
    by_variant = {}
    for r in runs:
        by_variant.setdefault(r.variant, {})[r.seed] = r
    rows = []
    for what, a, b in EFFECTS:
        if a not in by_variant or b not in by_variant:
            continue
        seeds = sorted(set(by_variant[a]) & set(by_variant[b]))
        err_a = np.stack([~by_variant[a][s].test_correct for s in seeds])  # (S, N)
        err_b = np.stack([~by_variant[b][s].test_correct for s in seeds])
        ours, lo, hi = paired_bootstrap(err_a, err_b)
        paper = reference["table1"][a]["test_error_pct"] - reference["table1"][b]["test_error_pct"]
        distinguishable = lo > 0 or hi < 0
        rows.append({
            "effect": what, "paper_delta": paper, "our_delta": ours, "ci_low": lo, "ci_high": hi,
            "same_direction": bool(np.sign(ours) == np.sign(paper)) if ours != 0 else False,
            "distinguishable_from_noise": distinguishable,
        })
    return pd.DataFrame(rows)


def _pct(x: float, digits: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


SMOKE_BANNER = ("> **⚠ SMOKE RUN — these numbers come from the smoke profile (tiny data subsets, 1 epoch) "
                "and mean nothing about the paper.** Run `make repro` (paper protocol) on a GPU for real results.")


def render_markdown(summary: pd.DataFrame, effect_table: pd.DataFrame, *, profile: str,
                    deviations: list[str], provenance: dict, figures: dict[str, str], reference: dict) -> str:
    """reports/ablation.md: banner (smoke), Table 1 replica, effects, affine column, figures, deviations, provenance."""
    lines = ["# Table 1 replica: Dynamic Routing Between Capsules", ""]
    if profile == "smoke":
        lines += [SMOKE_BANNER, ""]
    lines += [f"Profile **{profile}**. MNIST test error in percent: ours as mean ± sample std over n seeds "
              f"(per-seed values beside), the paper's from {reference['source']} (Table 1). Verdict: "
              f"`reproduced` when |ours − paper| ≤ 2σ with σ = max(paper σ, {MIN_SIGMA}), else `better` or "
              "`not reproduced`.", "",
              "| variant | routing | recon | n | ours (%) | per seed | paper (%) | Δ (pp) | verdict | re-runs (context) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in summary.iterrows():
        routing = r.routing_iterations if r.model == "capsnet" else "–"
        recon = ("yes" if r.reconstruction else "no") if r.model == "capsnet" else "–"
        paper = _pct(r.paper_test_error) + ("" if math.isnan(r.paper_test_error_std) else f" ± {r.paper_test_error_std:.3f}")
        lines.append(f"| {r.variant} | {routing} | {recon} | {r.n_seeds} | {_pct(r.test_error_mean)} ± "
                     f"{_pct(r.test_error_std)} | {r.test_errors} | {paper} | {r.delta:+.2f} | {r.verdict} | {r.reruns} |")
    lines += ["", "## Ablation effects", "",
              "Effect = error(A) − error(B) in percentage points; negative means A is better. 95 % CI from a paired "
              "bootstrap over test images (2,000 resamples, seeds pooled).", "",
              "| effect | paper | ours | 95 % CI | same direction | distinguishable from noise |", "|---|---|---|---|---|---|"]
    for _, e in effect_table.iterrows():
        lines.append(f"| {e.effect} | {e.paper_delta:+.2f} | {e.our_delta:+.2f} | [{e.ci_low:+.2f}, {e.ci_high:+.2f}] "
                     f"| {'yes' if e.same_direction else 'no'} | {'yes' if e.distinguishable_from_noise else 'no'} |")
    lines += ["", "## Affine-shifted test set", "",
              "Every variant evaluated, without retraining, on the MNIST test digits, each under one random affine "
              "transform from affNIST's ranges (see README). **The paper reports no number on this set**; its §5.2 "
              "affNIST experiment trains differently (40×40 canvas) and is not this column.", "",
              "| variant | MNIST test error (%) | affine-shifted error (%) |", "|---|---|---|"]
    for _, r in summary.iterrows():
        lines.append(f"| {r.variant} | {_pct(r.test_error_mean)} ± {_pct(r.test_error_std)} | "
                     f"{_pct(r.affine_test_error_mean)} ± {_pct(r.affine_test_error_std)} |")
    lines += ["", "## Parameters", "", "| variant | ours | paper |", "|---|---|---|"]
    for _, r in summary.iterrows():
        lines.append(f"| {r.variant} | {int(r.n_params):,} | {r.paper_n_params / 1e6:.1f}M |")
    lines += ["", "## Figures", ""]
    lines += [f"![{title}]({path})" for title, path in figures.items()]
    lines += ["", "## Deviations from the paper and the official code", ""]
    lines += [f"- {d}" for d in deviations]
    lines += ["", "## Provenance", ""]
    lines += [f"- **{k}**: {v}" for k, v in provenance.items()]
    return "\n".join(lines) + "\n"


def recipe_differences(train_params: dict, reference: dict) -> list[str]:
    """The profile's training params that differ from the paper protocol."""
    recipe = reference["recipe"]
    return [f"train.{k} = {train_params[k]} (paper protocol: {recipe[k]})"
            for k in recipe if k != "source" and train_params.get(k) != recipe[k]]
