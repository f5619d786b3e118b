"""Stage `report`: Table 1 against the paper, ablation effects with paired bootstrap CIs,
the affine-shifted column, §5.2 (CapsNet vs CNN on affNIST(-style)), deviations and provenance.

Pure functions over the evaluate stage's outputs; `capsnet report` writes the files. The paper's
numbers come from paper_reference.yaml (cited), never from code or templates.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from safetensors.torch import load_file

from pipeline import baseline, capsnet, train
from pipeline.affnist import REAL_AFFNIST
from pipeline.params import Params

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
    correct: dict[str, np.ndarray]  # test set name -> (N,) bool per image
    breakdown: dict  # evaluate's breakdown.json: per-class accuracy, transform bins, set sources
    digit_index: dict[str, np.ndarray]  # test set name -> (N,) source digit per image, where known

    @property
    def image_size(self) -> int:
        return self.config["config"]["image_size"]


def _needed(models_dir: Path, results_dir: Path, variant: str, seed: int) -> list[Path]:
    model_dir, result_dir = models_dir / variant / f"seed{seed}", results_dir / variant / f"seed{seed}"
    return [result_dir / "metrics.json", result_dir / "predictions.safetensors", result_dir / "breakdown.json",
            model_dir / "config.json", model_dir / "history.csv"]


def missing_runs(models_dir: Path, results_dir: Path, variants: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """The (variant, seed) pairs that have no complete evaluation (not run, or stopped before the end)."""
    return [(v, s) for v in variants for s in seeds
            if not all(p.is_file() for p in _needed(models_dir, results_dir, v, s))]


def load_runs(models_dir: Path, results_dir: Path, variants: list[str], seeds: list[int],
              skip: list[tuple[str, int]] = ()) -> list[Run]:
    """Every (variant, seed)'s evaluation but those in ``skip``; a missing one is an error naming it and its path."""
    runs = []
    for variant in variants:
        for seed in seeds:
            if (variant, seed) in skip:
                continue
            model_dir, result_dir = models_dir / variant / f"seed{seed}", results_dir / variant / f"seed{seed}"
            missing = [str(p) for p in _needed(models_dir, results_dir, variant, seed) if not p.is_file()]
            if missing:
                raise ReportError(f"variant {variant} seed {seed} has no evaluation: missing {', '.join(missing)}; "
                                  f"run `dvc repro evaluate@{variant}-{seed}`")
            pred = load_file(str(result_dir / "predictions.safetensors"))
            sets = [k.removesuffix("_labels") for k in pred if k.endswith("_labels")]
            runs.append(Run(
                variant, seed, json.loads((result_dir / "metrics.json").read_text()),
                json.loads((model_dir / "config.json").read_text()), pd.read_csv(model_dir / "history.csv"),
                {name: (pred[f"{name}_labels"] == pred[f"{name}_preds"]).numpy() for name in sets},
                json.loads((result_dir / "breakdown.json").read_text()),
                {name: pred[f"{name}_digit_index"].numpy() for name in sets if f"{name}_digit_index" in pred}))
    return runs


PUBLISHED = {"models": ("config.json", "history.csv"),
             "results": ("metrics.json", "breakdown.json", "reconstructions.png", "fig4.png")}


def publish_runs(models_dir: Path, results_dir: Path, dest: Path) -> list[tuple[str, int]]:
    """Copy every complete run's records into dest/models and dest/results, small enough for git.

    Predictions keep only what the report reads (labels, predicted classes, source digits): no
    scores, no weights. `capsnet report DEST/models DEST/results ...` then rewrites the report
    from the copies alone. Returns the (variant, seed) pairs copied.
    """
    import shutil

    from safetensors.torch import save_file

    copied = []
    for metrics in sorted(results_dir.glob("*/seed*/metrics.json")):
        variant, seed_dir = metrics.parent.parent.name, metrics.parent.name
        seed = int(seed_dir.removeprefix("seed"))
        if not all(p.is_file() for p in _needed(models_dir, results_dir, variant, seed)):
            continue
        for kind, names in PUBLISHED.items():
            src = (models_dir if kind == "models" else results_dir) / variant / seed_dir
            out = dest / kind / variant / seed_dir
            out.mkdir(parents=True, exist_ok=True)
            for name in names:
                if (src / name).is_file():
                    shutil.copyfile(src / name, out / name)
        pred = load_file(str(metrics.parent / "predictions.safetensors"))
        keep = {k: t.contiguous() for k, t in pred.items() if k.endswith(("_labels", "_preds", "_digit_index"))}
        save_file(keep, str(dest / "results" / variant / seed_dir / "predictions.safetensors"))
        copied.append((variant, seed))
    return copied


def training_commit(run: Run, journal_dir: Path) -> str:
    """The commit a run trained at: config.json's environment, else its tracking journal's start tags."""
    commit = run.config["environment"].get("git_commit")
    journal = journal_dir / f"{run.config.get('run_id')}.jsonl"
    if not commit and journal.is_file():
        with journal.open() as f:
            commit = json.loads(f.readline()).get("tags", {}).get("git_commit")
    return commit or "not recorded"


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


def paired_bootstrap(errors_a: np.ndarray, errors_b: np.ndarray, n_boot: int = 2000, seed: int = 0,
                     groups: np.ndarray | None = None) -> tuple[float, float, float]:
    """Difference of error rates (A − B, percentage points) and its 95 % CI.

    errors_a, errors_b: (S, N) 0/1 per seed and test image, paired by seed and image (seeds
    pooled, the same resample for every seed). Without ``groups`` images are resampled; with
    ``groups`` (N,) (the source digit of each affNIST-style image) whole groups are, since the
    transforms of one digit succeed or fail together (a cluster bootstrap).
    """
    if errors_a.shape != errors_b.shape:
        raise ReportError(f"paired bootstrap needs equal shapes, got {errors_a.shape} and {errors_b.shape}")
    diff = (errors_a.astype(float) - errors_b.astype(float)).mean(axis=0)  # (N,) per image, seeds pooled
    groups = np.arange(diff.shape[0]) if groups is None else np.asarray(groups)
    sums, counts = np.bincount(groups, weights=diff), np.bincount(groups)  # (G,) per group
    rng = np.random.default_rng(seed)
    g = sums.shape[0]
    boots = np.empty(n_boot)
    for k in range(n_boot):
        pick = rng.integers(0, g, g)  # (G,) groups drawn with replacement
        boots[k] = sums[pick].sum() / counts[pick].sum()
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
        err_a = np.stack([~by_variant[a][s].correct["test"] for s in seeds])  # (S, N)
        err_b = np.stack([~by_variant[b][s].correct["test"] for s in seeds])
        ours, lo, hi = paired_bootstrap(err_a, err_b)
        paper = reference["table1"][a]["test_error_pct"] - reference["table1"][b]["test_error_pct"]
        distinguishable = lo > 0 or hi < 0
        rows.append({
            "effect": what, "paper_delta": paper, "our_delta": ours, "ci_low": lo, "ci_high": hi,
            "same_direction": bool(np.sign(ours) == np.sign(paper)) if ours != 0 else False,
            "distinguishable_from_noise": distinguishable,
        })
    return pd.DataFrame(rows)


# --- §5.2: CapsNet vs CNN on affNIST(-style) -------------------------------------------------------


def _model_kind(run: Run) -> str:
    return "capsnet" if run.config["config"]["model"] == "capsnet" else "cnn"


def affnist_summary(runs: list[Run], reference: dict) -> pd.DataFrame:
    """§5.2, one row per 40×40 variant: expanded-MNIST and affNIST(-style) accuracy (mean ± sample
    std over seeds, per-seed values), where each seed stopped, and the paper's values."""
    rows = []
    for variant in dict.fromkeys(r.variant for r in runs):
        mine = [r for r in runs if r.variant == variant]
        paper = reference["affnist"][_model_kind(mine[0])]
        expanded = [100 - r.metrics["expanded_test_error_pct"] for r in mine]
        affine = [100 - r.metrics["affnist_test_error_pct"] for r in mine]
        rows.append({
            "variant": variant, "model": mine[0].config["config"]["model"], "n_seeds": len(mine),
            "n_params": mine[0].metrics["n_params"],
            "expanded_acc_mean": float(np.mean(expanded)),
            "expanded_acc_std": float(np.std(expanded, ddof=1)) if len(mine) > 1 else math.nan,
            "expanded_accs": " ".join(f"{a:.2f}" for a in expanded),
            "affnist_acc_mean": float(np.mean(affine)),
            "affnist_acc_std": float(np.std(affine, ddof=1)) if len(mine) > 1 else math.nan,
            "affnist_accs": " ".join(f"{a:.2f}" for a in affine),
            "stopped": " ".join(f"{r.config['epochs_trained']}{'' if r.config['stop_reason'] == 'target' else '*'}"
                                for r in mine),
            "all_reached_target": all(r.config["stop_reason"] == "target" for r in mine),
            "target_accuracy_pct": mine[0].config["config"]["target_accuracy_pct"],
            "paper_expanded_acc": paper["expanded_mnist_accuracy_pct"], "paper_affnist_acc": paper["affnist_accuracy_pct"],
            "affnist_source": mine[0].breakdown["sources"].get("affnist_test", "unknown"),
        })
    return pd.DataFrame(rows)


def gap_verdict(ci_low: float, ci_high: float, paper_gap: float) -> str:
    """The §5.2 claim, CapsNet − CNN affNIST accuracy: `reproduced` when the 95 % CI lies above 0 and
    reaches the paper's gap; `larger gap` when it lies wholly above it; `smaller gap` when it is
    above 0 but wholly below the paper's gap; `not reproduced` when it touches or crosses 0."""
    if ci_low <= 0:
        return "not reproduced"
    if ci_low > paper_gap:
        return "larger gap"
    return "reproduced" if ci_high >= paper_gap else "smaller gap"


def affnist_gap(runs: list[Run], reference: dict) -> dict | None:
    """CapsNet − CNN accuracy on affNIST(-style), paired by seed and image, with a bootstrap CI."""
    capsnets = [r for r in runs if _model_kind(r) == "capsnet"]
    cnns = [r for r in runs if _model_kind(r) == "cnn"]
    if not capsnets or not cnns:
        return None
    caps_variant, cnn_variant = capsnets[0].variant, cnns[0].variant
    by = {(r.variant, r.seed): r for r in runs}
    seeds = sorted({r.seed for r in capsnets if r.variant == caps_variant} & {r.seed for r in cnns if r.variant == cnn_variant})
    err_cnn = np.stack([~by[cnn_variant, s].correct["affnist_test"] for s in seeds])  # (S, N)
    err_caps = np.stack([~by[caps_variant, s].correct["affnist_test"] for s in seeds])  # (S, N)
    groups = capsnets[0].digit_index.get("affnist_test")  # None for the real affNIST: images resampled
    gap, lo, hi = paired_bootstrap(err_cnn, err_caps, groups=groups)  # error(CNN) − error(CapsNet) = accuracy gap
    ref = reference["affnist"]
    paper_gap = ref["capsnet"]["affnist_accuracy_pct"] - ref["cnn"]["affnist_accuracy_pct"]
    return {"capsnet": caps_variant, "cnn": cnn_variant, "seeds": seeds, "gap": gap, "ci_low": lo, "ci_high": hi,
            "resampled": "test digits (all transforms of a digit together)" if groups is not None else "test images",
            "paper_gap": paper_gap, "verdict": gap_verdict(lo, hi, paper_gap),
            "matched": all(r.config["stop_reason"] == "target" for r in capsnets + cnns)}


def transform_bins(runs: list[Run], set_name: str) -> dict[str, dict[str, dict[str, list]]]:
    """Per variant and transform parameter: bin centres and accuracy mean ± std over seeds."""
    out: dict[str, dict] = {}
    for variant in dict.fromkeys(r.variant for r in runs):
        per_seed = [r.breakdown["bins"][set_name] for r in runs if r.variant == variant and set_name in r.breakdown["bins"]]
        if not per_seed:
            continue
        out[variant] = {}
        for name, first in per_seed[0].items():
            edges = np.array(first["edges"])
            acc = np.array([[np.nan if a is None else a for a in b[name]["accuracy_pct"]] for b in per_seed])  # (S, bins)
            with warnings.catch_warnings():  # a bin empty in every seed, or filled in one, is NaN / has no std
                warnings.simplefilter("ignore", RuntimeWarning)
                mean, std = np.nanmean(acc, 0), np.nan_to_num(np.nanstd(acc, 0, ddof=1))
            out[variant][name] = {"centres": list((edges[:-1] + edges[1:]) / 2), "accuracy_pct": list(mean), "std": list(std)}
    return out


def render_affnist(table: pd.DataFrame, gap: dict | None, reference: dict) -> list[str]:
    """The report's §5.2 section (markdown lines)."""
    ref = reference["affnist"]
    lines = ["## §5.2 Robustness to affine transformations", "",
             f"Both models trained on MNIST digits at a random position on a 40×40 canvas (no other augmentation), "
             f"stopped at the first epoch whose expanded-MNIST accuracy reaches the target ({_pct(table.target_accuracy_pct.iloc[0])} %), "
             f"or at the epoch budget, then tested without retraining on: **{table.affnist_source.iloc[0]}**. "
             f"Paper: {ref['source']}. Accuracy in percent, mean ± sample std over seeds.", "",
             "| variant | params | n | expanded MNIST (%) | per seed | affNIST (%) | per seed | epochs (* = budget, not target) "
             "| paper expanded | paper affNIST | Δ affNIST (pp) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        lines.append(f"| {r.variant} | {int(r.n_params):,} | {r.n_seeds} | {_pct(r.expanded_acc_mean)} ± {_pct(r.expanded_acc_std)} "
                     f"| {r.expanded_accs} | {_pct(r.affnist_acc_mean)} ± {_pct(r.affnist_acc_std)} | {r.affnist_accs} "
                     f"| {r.stopped} | {_pct(r.paper_expanded_acc)} | {_pct(r.paper_affnist_acc, 0)} "
                     f"| {r.affnist_acc_mean - r.paper_affnist_acc:+.2f} |")
    if gap is not None:
        lines += ["", f"**CapsNet − CNN on affNIST(-style): {gap['gap']:+.2f} pp**, 95 % CI [{gap['ci_low']:+.2f}, "
                  f"{gap['ci_high']:+.2f}] (paired bootstrap resampling {gap['resampled']}, seeds "
                  f"{', '.join(map(str, gap['seeds']))} pooled). Paper: "
                  f"{gap['paper_gap']:+.0f} pp. **Verdict: {gap['verdict']}** (`reproduced` = CI above 0 and reaching the "
                  "paper's gap; `smaller gap`/`larger gap` = CI above 0 but wholly below/above it; `not reproduced` = CI "
                  "touches 0)."]
        if not gap["matched"]:
            lines += ["", "> Not every run reached the target accuracy before its epoch budget, so the two models are "
                      "**not compared at matched expanded-MNIST accuracy** as the paper's are."]
    if not table.affnist_source.iloc[0].startswith(REAL_AFFNIST):
        lines += ["", "> The affNIST column here is the **affNIST-style set** this pipeline generates (same ranges and "
                  "canvas, our transforms), not the real affNIST; Δ against the paper's affNIST numbers is context, "
                  "not a like-for-like comparison. Set `$CAPSNET_AFFNIST_MIRROR` to the real test files to compare directly."]
    return lines


def _pct(x: float, digits: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


SMOKE_BANNER = ("> **⚠ SMOKE RUN — these numbers come from the smoke profile (tiny data subsets, 1 epoch) "
                "and mean nothing about the paper.** Run `make repro` (paper protocol) on a GPU for real results.")


def render_markdown(summary: pd.DataFrame, effect_table: pd.DataFrame, *, profile: str,
                    not_run: dict[str, list[int]] | None = None,
                    deviations: list[str], provenance: dict, figures: dict[str, str], reference: dict,
                    affnist: list[str] | None = None) -> str:
    """reports/ablation.md: banner (smoke), Table 1 replica, effects, affine column, §5.2 (the lines of
    render_affnist, when given), figures, deviations, provenance."""
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
              "affNIST experiment trains differently (40×40 canvas): see the §5.2 section below.", "",
              "| variant | MNIST test error (%) | affine-shifted error (%) |", "|---|---|---|"]
    for _, r in summary.iterrows():
        lines.append(f"| {r.variant} | {_pct(r.test_error_mean)} ± {_pct(r.test_error_std)} | "
                     f"{_pct(r.affine_test_error_mean)} ± {_pct(r.affine_test_error_std)} |")
    if affnist:
        lines += ["", *affnist]
    lines += ["", "## Parameters", "", "| variant | ours | paper |", "|---|---|---|"]
    for _, r in summary.iterrows():
        lines.append(f"| {r.variant} | {int(r.n_params):,} | {r.paper_n_params / 1e6:.1f}M |")
    lines += ["", "## Figures", ""]
    lines += [f"![{title}]({path})" for title, path in figures.items()]
    if not_run:
        lines += ["", "## Not run", "",
                  "Listed in params.yaml's `ablation` but without a complete evaluation in this report: not run, "
                  "or stopped before its last epoch. Nothing is estimated for them.", ""]
        lines += [f"- {v}: seed(s) {', '.join(map(str, seeds))}" for v, seeds in not_run.items()]
    lines += ["", "## Deviations from the paper and the official code", ""]
    lines += [f"- {d}" for d in deviations]
    lines += ["", "## Provenance", ""]
    lines += [f"- **{k}**: {v}" for k, v in provenance.items()]
    return "\n".join(lines) + "\n"


def deviations(params: Params, reference: dict) -> list[str]:
    """Every deliberate deviation: the modules' DEVIATIONS, the profile's recipe changes, data subsets."""
    out = capsnet.DEVIATIONS + baseline.DEVIATIONS + train.DEVIATIONS
    out += recipe_differences(dataclasses.asdict(params.train), reference)
    if params.train.amp:
        out.append(train.BF16_NOTE)
    if not params.train.deterministic:
        out.append("train.deterministic = false: cuDNN autotuning and non-deterministic GPU kernels, so a re-run "
                   "of the same seed is not bit-identical (the paper protocol trains with deterministic: true).")
    if params.prepare.train_subset or params.prepare.test_subset:
        out.append(f"Data subsets: first {params.prepare.train_subset or 'all'} training and "
                   f"{params.prepare.test_subset or 'all'} test digits (prepare.*_subset).")
    if params.prepare.affnist_transforms != 32:
        out.append(f"affNIST-style set: {params.prepare.affnist_transforms} transform(s) per test digit "
                   "(affNIST has 32; prepare.affnist_transforms).")
    return out


def recipe_differences(train_params: dict, reference: dict) -> list[str]:
    """The profile's training params that differ from the paper protocol."""
    recipe = reference["recipe"]
    return [f"train.{k} = {train_params[k]} (paper protocol: {recipe[k]})"
            for k in recipe if k != "source" and train_params.get(k) != recipe[k]]
