"""Stage `report`: Table 1 against the paper (both recipes, final and best epoch), ablation effects
with paired bootstrap CIs, the affine-shifted column, deviations and provenance; §5.2's section is
pipeline.report_affnist.

Pure functions over the evaluate stage's outputs; `capsnet report` writes the files. The paper's
numbers come from paper_reference.yaml (cited), never from code or templates.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from safetensors.torch import load_file

from pipeline import baseline, capsnet, train
from pipeline.data import MULTIMNIST_SIZE, test_sets
from pipeline.evaluate_stage import uniform_metrics
from pipeline.errors import UserError
from pipeline.params import Params

MIN_SIGMA = 0.03  # verdict tolerance floor (percentage points)
LEGACY_ADAM_EPS = 1e-7  # what the code used before 25c5cb7, when config.json did not record it
EFFECTS = [  # (what changes, variant A, variant B): effect = error(A) − error(B)
    ("routing 3 vs 1, with reconstruction", "capsnet_r3_recon", "capsnet_r1_recon"),
    ("routing 3 vs 1, no reconstruction", "capsnet_r3", "capsnet_r1"),
    ("reconstruction on vs off, routing 1", "capsnet_r1_recon", "capsnet_r1"),
    ("reconstruction on vs off, routing 3", "capsnet_r3_recon", "capsnet_r3"),
    # the paper has no number for these: its text and its code are one method to it
    ("official vs paper recipe, routing 1, no reconstruction", "capsnet_r1_official", "capsnet_r1"),
    ("official vs paper recipe, routing 1, with reconstruction", "capsnet_r1_recon_official", "capsnet_r1_recon"),
    ("official vs paper recipe, routing 3, no reconstruction", "capsnet_r3_official", "capsnet_r3"),
    ("official vs paper recipe, routing 3, with reconstruction", "capsnet_r3_recon_official", "capsnet_r3_recon"),
]


class ReportError(UserError, RuntimeError):
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

    @property
    def recipe(self) -> str:
        """paper | official; runs trained before recipes existed are the paper's."""
        return self.config["config"].get("recipe", "paper")

    @property
    def adam_eps(self) -> float:
        """Adam's ε; runs trained before config.json recorded it (before 25c5cb7) used 1e-7."""
        return self.config.get("optimizer", {}).get("adam_eps", LEGACY_ADAM_EPS)


def table1_row(variant: str, recipe: str) -> str:
    """The paper's Table 1 row a variant replicates: an official-recipe twin shares its paper twin's row."""
    return variant.removesuffix("_official") if recipe == "official" else variant


def best_epoch(history: pd.DataFrame) -> tuple[float, int]:
    """(lowest per-epoch test error %, its epoch), the first one on a tie. Selected on the test set."""
    k = int(history.test_error_pct.to_numpy().argmin())
    return float(history.test_error_pct.iloc[k]), int(history.epoch.iloc[k])


def _needed(models_dir: Path, results_dir: Path, variant: str, seed: int) -> list[Path]:
    model_dir, result_dir = models_dir / variant / f"seed{seed}", results_dir / variant / f"seed{seed}"
    return [result_dir / "metrics.json", result_dir / "predictions.safetensors", result_dir / "breakdown.json",
            model_dir / "config.json", model_dir / "history.csv"]


def missing_runs(models_dir: Path, results_dir: Path, variants: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """The (variant, seed) pairs that have no complete evaluation (not run, or stopped before the end)."""
    return [(v, s) for v in variants for s in seeds
            if not all(p.is_file() for p in _needed(models_dir, results_dir, v, s))]


def _correct(labels, preds) -> np.ndarray:
    """(N,) bool per test example; MultiMNIST's (N, 2) sorted pairs are right only as a whole."""
    same = (labels == preds).numpy()
    return same.all(axis=1) if same.ndim == 2 else same


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
            config = json.loads((model_dir / "config.json").read_text())
            metrics = uniform_metrics(json.loads((result_dir / "metrics.json").read_text()),
                                      *test_sets(config["config"]["image_size"]))
            runs.append(Run(
                variant, seed, metrics, config, pd.read_csv(model_dir / "history.csv"),
                {name: _correct(pred[f"{name}_labels"], pred[f"{name}_preds"]) for name in sets},
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
        # MultiMNIST's (P, 2) pairs are left out (10M rows at paper size): the report reads only their metrics
        keep = {k: t.contiguous() for k, t in pred.items()
                if k.endswith(("_labels", "_preds", "_digit_index")) and t.dim() == 1}
        save_file(keep, str(dest / "results" / variant / seed_dir / "predictions.safetensors"))
        copied.append((variant, seed))
    return copied


def run_deviations(runs: list[Run]) -> list[str]:
    """Deviations that belong to how particular runs were trained, not to today's code."""
    old = [r for r in runs if r.adam_eps != train.ADAM_EPS]
    if not old:
        return []
    eps = ", ".join(f"{e:g}" for e in sorted({r.adam_eps for r in old}))
    variants = ", ".join(dict.fromkeys(r.variant for r in old))
    return [f"Adam ε = {eps} in {len(old)} of {len(runs)} runs ({variants}), trained before the code used TF1's "
            f"default {train.ADAM_EPS:g} (the official code's; 1e-7 is the Keras default)."]


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
        errors = [r.metrics["error_pct"] for r in mine]
        affine = [r.metrics["transformed_error_pct"] for r in mine]
        paper = reference["table1"].get(table1_row(variant, mine[0].recipe), {})
        cfg = mine[0].config["config"]
        mean = float(np.mean(errors))
        best = [best_epoch(r.history) for r in mine]
        row = {
            "variant": variant, "model": cfg["model"], "recipe": mine[0].recipe,
            "routing_iterations": cfg["routing_iterations"], "reconstruction": cfg["reconstruction"], "n_seeds": len(mine),
            "test_error_mean": mean, "test_error_std": float(np.std(errors, ddof=1)) if len(errors) > 1 else math.nan,
            "test_errors": " ".join(f"{e:.2f}" for e in errors),
            "final_epochs": " ".join(str(len(r.history)) for r in mine),
            "best_error_mean": float(np.mean([b[0] for b in best])),
            "best_errors": " ".join(f"{e:.2f}@{k}" for e, k in best),
            "paper_test_error": paper.get("test_error_pct", math.nan),
            "paper_test_error_std": paper.get("test_error_std") if paper.get("test_error_std") is not None else math.nan,
            "affine_test_error_mean": float(np.mean(affine)),
            "affine_test_error_std": float(np.std(affine, ddof=1)) if len(affine) > 1 else math.nan,
            "n_params": mine[0].metrics["n_params"], "paper_n_params": paper.get("n_params", math.nan),
            "reruns": reference.get("reruns", {}).get(variant, "") if mine[0].recipe == "paper" else "",
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
        table1 = reference["table1"]
        paper = table1[a]["test_error_pct"] - table1[b]["test_error_pct"] if a in table1 and b in table1 else math.nan
        distinguishable = lo > 0 or hi < 0
        rows.append({
            "effect": what, "paper_delta": paper, "our_delta": ours, "ci_low": lo, "ci_high": hi,
            "same_direction": bool(np.sign(ours) == np.sign(paper)) if ours != 0 and not math.isnan(paper) else None,
            "distinguishable_from_noise": distinguishable,
        })
    return pd.DataFrame(rows)


def fmt_pct(x: float, digits: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


SMOKE_BANNER = ("> **⚠ SMOKE RUN — these numbers come from the smoke profile (tiny data subsets, 1 epoch) "
                "and mean nothing about the paper.** Run `make repro` (paper protocol) on a GPU for real results.")


def render_markdown(summary: pd.DataFrame, effect_table: pd.DataFrame, *, profile: str,
                    not_run: dict[str, list[int]] | None = None,
                    deviations: list[str], provenance: dict, figures: dict[str, str], reference: dict,
                    affnist: list[str] | None = None, multimnist: list[str] | None = None) -> str:
    """reports/ablation.md: banner (smoke), Table 1 replica, Table 1 with both columns (the lines of
    report_multimnist.render_both_columns, when given), effects, affine column, §5.2 (the lines of
    render_affnist, when given), figures, deviations, provenance."""
    lines = ["# Table 1 replica: Dynamic Routing Between Capsules", ""]
    if profile == "smoke":
        lines += [SMOKE_BANNER, ""]
    lines += [f"Profile **{profile}**. MNIST test error in percent: ours as mean ± sample std over n seeds "
              f"(per-seed values beside), the paper's from {reference['source']} (Table 1). Verdict: "
              f"`reproduced` when |ours − paper| ≤ 2σ with σ = max(paper σ, {MIN_SIGMA}), else `better` or "
              "`not reproduced`.", "",
              "Recipe `paper` trains what the paper's text says; `official` what the authors' code computes "
              "(loss scale, PrimaryCaps scaling, DigitCaps bias, initialisation: see Deviations); both are "
              "compared with the same Table 1 value. Errors are the **final epoch's** (what the verdict uses).", "",
              "| variant | recipe | routing | recon | n | ours (%) | per seed | paper (%) | Δ (pp) | verdict | re-runs (context) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in summary.iterrows():
        routing = r.routing_iterations if r.model == "capsnet" else "–"
        recon = ("yes" if r.reconstruction else "no") if r.model == "capsnet" else "–"
        recipe = r.recipe if r.model == "capsnet" else "–"
        paper = fmt_pct(r.paper_test_error) + ("" if math.isnan(r.paper_test_error_std) else f" ± {r.paper_test_error_std:.3f}")
        lines.append(f"| {r.variant} | {recipe} | {routing} | {recon} | {r.n_seeds} | {fmt_pct(r.test_error_mean)} ± "
                     f"{fmt_pct(r.test_error_std)} | {r.test_errors} | {paper} | {r.delta:+.2f} | {r.verdict} | {r.reruns} |")
    if multimnist:
        lines += ["", *multimnist]
    lines += ["", "## Checkpoint selection", "",
              "The final epoch's error (the headline above) beside the lowest per-epoch error of each run, "
              "`error@epoch`. **The best epoch is selected on the test set, so it is optimistic**: it is shown "
              "because several public re-runs report it and the paper does not say which checkpoint it used.", "",
              "| variant | final epoch (%) | epochs | best epoch (%, selected on test) | per seed (error@epoch) |",
              "|---|---|---|---|---|"]
    for _, r in summary.iterrows():
        lines.append(f"| {r.variant} | {fmt_pct(r.test_error_mean)} | {r.final_epochs} | {fmt_pct(r.best_error_mean)} | "
                     f"{r.best_errors} |")
    lines += ["", "## Ablation effects", "",
              "Effect = error(A) − error(B) in percentage points; negative means A is better. 95 % CI from a paired "
              "bootstrap over test images (2,000 resamples, seeds pooled).", "",
              "| effect | paper | ours | 95 % CI | same direction | distinguishable from noise |", "|---|---|---|---|---|---|"]
    for _, e in effect_table.iterrows():
        paper = "– (no number)" if math.isnan(e.paper_delta) else f"{e.paper_delta:+.2f}"
        same = "–" if e.same_direction is None else ("yes" if e.same_direction else "no")
        lines.append(f"| {e.effect} | {paper} | {e.our_delta:+.2f} | [{e.ci_low:+.2f}, {e.ci_high:+.2f}] "
                     f"| {same} | {'yes' if e.distinguishable_from_noise else 'no'} |")
    lines += ["", "## Affine-shifted test set", "",
              "Every variant evaluated, without retraining, on the MNIST test digits, each under one random affine "
              "transform from affNIST's ranges (see README). **The paper reports no number on this set**; its §5.2 "
              "affNIST experiment trains differently (40×40 canvas): see the §5.2 section below.", "",
              "| variant | MNIST test error (%) | affine-shifted error (%) |", "|---|---|---|"]
    for _, r in summary.iterrows():
        lines.append(f"| {r.variant} | {fmt_pct(r.test_error_mean)} ± {fmt_pct(r.test_error_std)} | "
                     f"{fmt_pct(r.affine_test_error_mean)} ± {fmt_pct(r.affine_test_error_std)} |")
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
    out = list(capsnet.DEVIATIONS)
    recipes = {v.recipe for name, v in params.variants.items() if name in params.ablation.variants and v.model == "capsnet"}
    out += (capsnet.PAPER_RECIPE_DEVIATIONS if "paper" in recipes else [])
    out += (capsnet.OFFICIAL_RECIPE_DEVIATIONS if "official" in recipes else [])
    out += baseline.DEVIATIONS + train.DEVIATIONS
    out += recipe_differences(dataclasses.asdict(params.train), reference)
    if params.train.amp:
        out.append(train.BF16_NOTE)
    if not params.train.deterministic:
        out.append("train.deterministic = false: cuDNN autotuning and non-deterministic GPU kernels, so a re-run "
                   "of the same seed is not bit-identical (the paper protocol trains with deterministic: true).")
    if params.prepare.train_subset or params.prepare.test_subset:
        out.append(f"Data subsets: first {params.prepare.train_subset or 'all'} training and "
                   f"{params.prepare.test_subset or 'all'} test digits (prepare.*_subset).")
    if any(params.variant(v).image_size == MULTIMNIST_SIZE for v in params.ablation.variants):
        from pipeline import report_multimnist  # it builds on this module

        out += baseline.MULTIMNIST_DEVIATIONS + report_multimnist.DEVIATIONS
        out += report_multimnist.test_size_deviation(params.prepare.multimnist_pairs_per_digit,
                                                     params.prepare.test_subset)
    if params.prepare.affnist_transforms != 32:
        out.append(f"affNIST-style set: {params.prepare.affnist_transforms} transform(s) per test digit "
                   "(affNIST has 32; prepare.affnist_transforms).")
    return out


def recipe_differences(train_params: dict, reference: dict) -> list[str]:
    """The profile's training params that differ from the paper protocol."""
    recipe = reference["recipe"]
    return [f"train.{k} = {train_params[k]} (paper protocol: {recipe[k]})"
            for k in recipe if k != "source" and train_params.get(k) != recipe[k]]
