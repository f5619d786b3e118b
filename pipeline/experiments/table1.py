"""Table 1 (§5.1): MNIST digits shifted by up to ±2 px, scored on the MNIST test set; every
variant also evaluated, without retraining, on the affine-shifted test set.

The affine-shifted set is every test digit under one random affine transform drawn from
affNIST's ranges (PAPER.md §5.2), translated so that the digit stays inside the 28×28 frame. The
paper reports no number on it; it says how far each Table 1 model generalises beyond shifts.
"""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.core.files import writable_dir
from pipeline.core.params import Params
from pipeline.data.idx import MNIST_SIZE
from pipeline.data.splits import save_split
from pipeline.data.transforms import AffineRanges, make_affine_set, random_shift, ranges_metadata
from pipeline.experiments import base
from pipeline.experiments import table1_figures as t1_figures
from pipeline.experiments import table1_readme as t1_readme
from pipeline.experiments import table1_report as t1
from pipeline.experiments.base import configure, examples_per_epoch, planned  # noqa: F401 (this experiment's, as they are)
from pipeline.report import claims as rc
from pipeline.report import figures
from pipeline.report.document import Context, Section
from pipeline.report.runs import Run, read_table
from pipeline.training.experiment import Batch, predict, to_float

NAME = "table1"
IMAGE_SIZE = MNIST_SIZE
MODELS = ("capsnet", "baseline_cnn", "pooling_cnn")
TEST_SETS = ("test", "affine_test")
MONTAGE = "affine_montage.png"
CURVES = "MNIST test set (Table 1)"  # its panel of the learning curves
# measured on this project's 2-core machine (capsnet, reports/benchmarks.md); the CNN scaled from it
# by the FLOP per training image `capsnet bench` counts (1.20 / 11.78 GFLOP)
CPU_EPOCH_SECONDS = {"capsnet": 600, "baseline_cnn": 5_900}


def ranges(params: Params) -> AffineRanges:
    p = params.prepare
    return AffineRanges(p.max_rotation_deg, p.max_shear, p.min_scale, p.max_scale)


def prepare_affine(out_dir: Path, test_images: torch.Tensor, test_labels: torch.Tensor, *, affine_seed: int,
                   ranges: AffineRanges) -> dict[str, torch.Tensor]:
    """Write affine_test.safetensors: every test digit under one affNIST-range transform
    (deterministic in ``affine_seed``); returns the images and their transforms."""
    affine_images, affine_params = make_affine_set(test_images, affine_seed, ranges)
    save_split(Path(out_dir) / "affine_test.safetensors", affine_images, test_labels, ranges_metadata(
        ranges, f"affine-shifted MNIST test set (generated, seed {affine_seed})"), affine_params=affine_params)
    return {"affine_images": affine_images, "affine_params": affine_params}


def prepare(params: Params, mnist: dict[str, torch.Tensor], out_dir: Path, figures_dir: Path) -> str:
    """The affine-shifted test set and its montage (originals above their shifted versions)."""
    out = prepare_affine(out_dir, mnist["test_images"], mnist["test_labels"], affine_seed=params.prepare.affine_seed,
                         ranges=ranges(params))
    k = min(params.prepare.montage_count, len(mnist["test_images"]))
    figures.affine_montage(mnist["test_images"][:k], out["affine_images"][:k], out["affine_params"][:k],
                           figures_dir / MONTAGE)
    return f"{len(out['affine_images'])} affine-shifted"


def training_data(data_dir: Path, cfg) -> tuple[dict[str, torch.Tensor], list[dict]]:
    return base.training_data(TEST_SETS[0], data_dir, cfg)


def synthetic_data(cfg, n: int, device: torch.device) -> dict[str, torch.Tensor]:
    return base.synthetic_data(cfg, n, device, IMAGE_SIZE)


class Training:
    """Table 1's training (pipeline.training.experiment.Experiment): every epoch a fresh
    permutation of the training digits (the last partial batch dropped), every step a batch
    shifted by up to ±max_shift px with zero fill; scored each epoch by the error on the clean test
    set. ``cfg`` is a pipeline.training.config.RunConfig. Capturable: a batch is gathered from the
    order by the step (an int or a device counter), with no host read."""

    capturable = True

    def __init__(self, cfg, data: dict[str, torch.Tensor], device: torch.device):
        self.images = data["train_images"].to(device)  # (N, 28, 28) uint8
        self.labels = data["train_labels"].to(device).long()  # (N,)
        self.test_images = data["test_images"].to(device)  # (M, S, S) uint8, copied once per process
        self.test_labels = data["test_labels"].to(device).long()  # (M,)
        self.batch_size, self.max_shift, self.image_size = cfg.batch_size, cfg.max_shift, cfg.image_size
        self.examples_per_epoch = self.images.shape[0]
        self.steps_per_epoch = self.examples_per_epoch // cfg.batch_size
        self.offsets = torch.arange(cfg.batch_size, device=device)  # (B,) a batch's places in the order

    def epoch_order(self, generator: torch.Generator) -> torch.Tensor:
        return torch.randperm(self.images.shape[0], generator=generator, device=self.images.device)  # (N,)

    def augment(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """(B, 28, 28) uint8 -> (B, S, S): Table 1's ±max_shift px shift."""
        return random_shift(images, self.max_shift, generator)

    def batch(self, order: torch.Tensor, step: int | torch.Tensor, generator: torch.Generator) -> Batch:
        idx = order[step * self.batch_size + self.offsets]  # (B,) the step's slice of the order, by gather
        return Batch(to_float(self.augment(self.images[idx], generator)), self.labels[idx], None)

    def test_error(self, model: torch.nn.Module, batch_size: int, amp: bool) -> float:
        _, preds = predict(model, self.test_images, batch_size, amp)  # (M,)
        return 100.0 * int((preds != self.test_labels).sum()) / self.test_labels.shape[0]  # exact count, one sync


def evaluate(model: torch.nn.Module, cfg, data_dir: Path, out: Path) -> base.Evaluation:
    """The MNIST test set and the affine-shifted set (`base.evaluate_sets`)."""
    return base.evaluate_sets(TEST_SETS, model, cfg, data_dir, out)


def report(runs: list[Run], ctx: Context) -> Section:
    """Table 1's section: per protocol, our rows against the paper's with verdicts and effects and
    what would settle them, the affine-shifted column, parameters; the four Table 1 claims; the
    error-bar, effect, reconstruction and Fig. 4 figures, the montage; results.csv, effects.csv and the
    data of dvc.yaml's plots; Table 1's deviations; its README lines. Leaves its summary in
    ``ctx.shared["table1"]`` (MultiMNIST's column stands beside it)."""
    plot_dir = writable_dir(ctx.out / "plots", "report")
    deviations = t1.deviations(ctx.params, ctx.reference)
    if not runs:
        t1_figures.no_runs(ctx.fig_dir, plot_dir)
        return Section(tables={"results.csv": "", "effects.csv": ""}, deviations=deviations)
    summary, effect_table = t1.summarize(runs, ctx.reference, ctx.bench), t1.effects(runs, ctx.reference, ctx.bench)
    ctx.shared["table1"] = summary
    protocol = summary.protocol.iloc[0]
    shown = t1_figures.figures_of(runs, summary, ctx.results_dir, ctx.fig_dir)
    shown |= t1_figures.effects_figure(effect_table, protocol, ctx.fig_dir)
    t1_figures.dvc_plot_data(runs, summary, ctx.results_dir, plot_dir)
    if (ctx.fig_dir / MONTAGE).is_file():
        shown["Affine-shifted test set"] = f"figures/{MONTAGE}"
    results_csv = summary.to_csv(index=False, float_format="%.4f")
    effects_csv = effect_table.to_csv(index=False, float_format="%.4f")
    return Section(lines=t1.render_section(summary, effect_table, ctx.reference),
                   claims=rc.effect_claims(effect_table, protocol), protocol=protocol, figures=shown,
                   tables={"results.csv": results_csv, "effects.csv": effects_csv}, deviations=deviations)


def readme(out: Path) -> list[str]:
    """Its lines of the README's results block, from results.csv and effects.csv as written."""
    return t1_readme.readme_lines(*(read_table(out / name) for name in ("results.csv", "effects.csv"))) \
        if (out / "results.csv").stat().st_size else []
