"""MultiMNIST (paper §6): two overlapping digits of different classes on a 36×36 canvas.

An example is a recipe, never stored pixels: (index a, index b) into one MNIST split and a shift
(dy, dx) per digit, each coordinate uniform in [−max_shift, max_shift]. Composing it pads each
28×28 digit by PAD = 4 to 36×36, shifts it with zero fill (ink pushed past the border is lost,
as in the official mnist_shift.py) and merges the two as min(a + b, 255) in uint8.

- Training draws a fresh pair and fresh shifts for every example of every step, on the device
  (`sample_pairs` + `compose`); the paper's fixed 60M-image set is 1,000 pairs per digit, which
  per-step sampling covers in expectation. b is uniform over the split's digits of other classes.
- The test set is fixed: `test_recipes` gives every test digit ``pairs_per_digit`` partners,
  deterministic from a seed. Stored as int32 indices and int8 shifts, a recipe takes 2·4 + 4·1 =
  12 bytes: the paper's 10M test examples are 120 MB of recipes where their pixels would be
  10M · 36 · 36 B = 13 GB. `evaluate` composes batches from the recipes on the device.
- The prediction is the two highest class scores; an example is correct only when that pair
  equals the true pair (order-free), so one right digit is an error (`pair_correct`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import torch
from safetensors.torch import save_file

from pipeline.core.errors import UserError
from pipeline.core.files import atomic_path, write_json
from pipeline.core.params import Params
from pipeline.data.idx import MNIST_SIZE
from pipeline.data.splits import dataset_input, load_split, save_split, split_metadata
from pipeline.data.transforms import translate
from pipeline.experiments import multimnist_report as rm
from pipeline.experiments import base
from pipeline.experiments.base import Evaluation
from pipeline.models import baseline
from pipeline.report import figures
from pipeline.report.document import Context, Section
from pipeline.report.runs import Run, run_figure
from pipeline.training.experiment import Batch, class_scores, to_float

NAME = "multimnist"
CANVAS = IMAGE_SIZE = 36  # each 28×28 digit padded by 4
MODELS = ("capsnet", "multimnist_cnn")
TEST_SETS = ("multimnist_test", "")  # the recipes; no transformed twin
CURVES = "MultiMNIST curve recipes (§6, pair error)"  # its panel of the learning curves
CPU_EPOCH_SECONDS: dict[str, float] = {}  # not measured
USES_EPOCH_SIZE = True  # train.multimnist_epoch_size: every example is drawn fresh
PAD = (CANVAS - MNIST_SIZE) // 2  # 4
CURVE_RECIPES = 10_000  # per-epoch learning curve: the first recipes (one partner per test digit)

DEVIATIONS = [
    "MultiMNIST training draws a fresh pair and fresh shifts for every example of every step (an epoch = "
    "train.multimnist_epoch_size examples) instead of the paper's fixed 60M-image set; the test set is fixed "
    "recipes (prepare.multimnist_pairs_per_digit partners per test digit).",
    f"MultiMNIST learning curves score the first {CURVE_RECIPES:,} test recipes (one partner per test digit) each "
    "epoch; the reported error uses every recipe.",
    "MultiMNIST column verdicts: the paper gives single numbers without a spread, so the interval of ours − paper "
    "holds our seed spread alone.",
]


class ClassIndex(NamedTuple):
    """A split's labels grouped by class, built once per split (`class_index`) for `sample_pairs`."""

    labels: torch.Tensor  # (N,) long
    order: torch.Tensor  # (N,) digit indices sorted by class
    starts: torch.Tensor  # (K,) where each class begins in order
    counts: torch.Tensor  # (K,) digits per class


def class_index(labels: torch.Tensor, num_classes: int = 10) -> ClassIndex:
    labels = labels.long()
    counts = torch.bincount(labels, minlength=num_classes)  # (K,)
    return ClassIndex(labels, torch.argsort(labels, stable=True), torch.cumsum(counts, 0) - counts, counts)


def sample_pairs(index: ClassIndex, n: int, max_shift: int, generator: torch.Generator,
                 a: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """n random recipes over a split (its `class_index`), on its device, no host sync.

    Returns pairs (n, 2) long: a uniform over the split (or the given ``a`` (n,)), b uniform over
    the digits whose class differs from a's (a uniform position in the class-sorted order with
    a's class block cut out); and shifts (n, 2, 2) long (per digit: dy, dx), each uniform in
    [−max_shift, max_shift].
    """
    labels, order, starts, counts = index
    device = labels.device
    if a is None:
        a = torch.randint(labels.shape[0], (n,), generator=generator, device=device)  # (n,)
    start_a, count_a = starts[labels[a]], counts[labels[a]]  # (n,), (n,)
    others = labels.shape[0] - count_a  # (n,) digits of the other classes
    r = torch.minimum((torch.rand(n, generator=generator, device=device) * others).long(), others - 1)  # (n,)
    b = order[torch.where(r < start_a, r, r + count_a)]  # (n,) skips a's class block
    shifts = torch.randint(-max_shift, max_shift + 1, (n, 2, 2), generator=generator, device=device)  # (n, 2, 2)
    return torch.stack([a, b], dim=1), shifts


def test_recipes(labels: torch.Tensor, pairs_per_digit: int, max_shift: int, seed: int) -> dict[str, torch.Tensor]:
    """The fixed test set: every digit of the split ``labels`` (N,) as digit a, ``pairs_per_digit``
    times, ordered round by round (recipe r·N + i has a = i), so any prefix of N recipes covers
    every test digit once. Deterministic from ``seed`` (CPU generator).

    Returns {"pairs": (P, 2) int32, "shifts": (P, 2, 2) int8} with P = N · pairs_per_digit.
    """
    index = class_index(labels.cpu())
    a = torch.arange(labels.shape[0]).repeat(pairs_per_digit)  # (P,)
    pairs, shifts = sample_pairs(index, a.shape[0], max_shift, torch.Generator().manual_seed(seed), a=a)
    return {"pairs": pairs.int(), "shifts": shifts.to(torch.int8)}


def place(digits: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """Pad each 28×28 digit by PAD to 36×36 and shift it by (dy, dx) with zero fill (ink pushed past
    the border is lost).  digits (n, 28, 28) uint8, shifts (n, 2) [dy, dx] -> (n, 36, 36) uint8."""
    return translate(digits, PAD + shifts, CANVAS)


def compose(images: torch.Tensor, pairs: torch.Tensor, shifts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Recipes to pixels, on images' device.

    images (N, 28, 28) uint8 (the split), pairs (n, 2), shifts (n, 2, 2) ->
    merged (n, 36, 36) uint8 = min(a + b, 255), and each digit alone, digits (n, 2, 36, 36) uint8
    (the reconstruction targets).
    """
    pairs, shifts = pairs.long().to(images.device), shifts.to(images.device)
    a = place(images[pairs[:, 0]], shifts[:, 0])  # (n, 36, 36)
    b = place(images[pairs[:, 1]], shifts[:, 1])  # (n, 36, 36)
    merged = (a.short() + b.short()).clamp_(max=255).to(torch.uint8)  # (n, 36, 36)
    return merged, torch.stack([a, b], dim=1)


def top2(scores: torch.Tensor) -> torch.Tensor:
    """The predicted pair: the two highest class scores, sorted by class.  (n, K) -> (n, 2)."""
    return scores.topk(2, dim=1).indices.sort(dim=1).values


def pair_correct(predicted: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Order-free pair match: (n, 2), (n, 2) -> (n,) bool; one right digit of two is wrong."""
    return (predicted.sort(dim=1).values == labels.sort(dim=1).values).all(dim=1)


@torch.no_grad()
def predict_pairs(model: torch.nn.Module, images: torch.Tensor, pairs: torch.Tensor, shifts: torch.Tensor,
                  batch_size: int, amp: bool = False) -> torch.Tensor:
    """Predicted pairs (P, 2) (`top2`) of test recipes, on the model's device, composed batch by
    batch (at most ``batch_size`` examples in memory as pixels)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    images, pairs, shifts = images.to(device), pairs.to(device), shifts.to(device)  # no-ops once on the device
    predicted = []
    for start in range(0, pairs.shape[0], batch_size):
        merged, _ = compose(images, pairs[start:start + batch_size], shifts[start:start + batch_size])
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            predicted.append(top2(class_scores(model(to_float(merged)))))  # (b, 2)
    model.train(was_training)
    return torch.cat(predicted)  # (P, 2)


def prepare_multimnist(out_dir: Path, test_images: torch.Tensor, test_labels: torch.Tensor, *,
                       pairs_per_digit: int, max_shift: int, seed: int) -> dict[str, torch.Tensor]:
    """Write out_dir/multimnist_test.safetensors: the 28×28 test digits and labels the recipes index,
    the recipes (`test_recipes`), and max_shift in its metadata (training samples with the same).
    Returns the tensors written."""
    recipes = test_recipes(test_labels, pairs_per_digit, max_shift, seed)
    metadata = {"source": f"MultiMNIST recipes: {pairs_per_digit} partners per test digit, shifts ≤ {max_shift} px, "
                          f"seed {seed}", "max_shift": str(max_shift), "pairs_per_digit": str(pairs_per_digit)}
    save_split(Path(out_dir) / "multimnist_test.safetensors", test_images, test_labels, metadata, **recipes)
    return recipes


def digit_confusion(predicted: torch.Tensor, labels: torch.Tensor, num_classes: int = 10) -> torch.Tensor:
    """Per-digit confusion of pair predictions: (P, 2), (P, 2) -> (K, K) counts, rows = true class.

    A true class that is among the predicted pair counts on the diagonal; the remaining true class
    (at most one per pair once the matched ones are removed; two when neither matched, in sorted
    order) counts against the remaining predicted class.
    """
    t, p = labels.sort(dim=1).values.long(), predicted.sort(dim=1).values.long()  # (P, 2)
    hit = (t[:, :, None] == p[:, None, :]).any(dim=2)  # (P, 2): true class i is predicted
    used = (p[:, :, None] == t[:, None, :]).any(dim=2)  # (P, 2): predicted class j is true
    cm = torch.zeros(num_classes, num_classes, dtype=torch.long)
    cm.index_put_((t[hit], t[hit]), torch.ones(int(hit.sum()), dtype=torch.long), accumulate=True)
    miss_t, miss_p = t[~hit], p[~used]  # row-major order pairs each remaining true with a remaining prediction
    cm.index_put_((miss_t, miss_p), torch.ones(miss_t.shape[0], dtype=torch.long), accumulate=True)
    return cm


@torch.no_grad()
def reconstruct_pairs(model: torch.nn.Module, merged: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
    """Each of the two predicted capsules decoded on its own (Fig. 5): merged (k, 36, 36) uint8,
    predicted (k, 2) -> (k, 2, 36, 36) in [0, 1]. The model needs a decoder."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    x = merged.to(device).unsqueeze(1).float().div_(255)  # (k, 1, 36, 36)
    out = model(x, predicted.long().to(device))  # reconstructions (k, 2, 1, 36, 36)
    model.train(was_training)
    return out.reconstructions.squeeze(2).float().cpu()  # (k, 2, 36, 36)


class Training:
    """MultiMNIST's training (§6; pipeline.training.experiment.Experiment): every example of every step a
    fresh pair and fresh shifts composed on the device, an epoch ``cfg.multimnist_epoch_size``
    examples; the targets are each digit alone (the decoder reconstructs both). Scored each epoch
    by the pair error on the first CURVE_RECIPES test recipes. ``cfg`` is a pipeline.training.config.RunConfig.
    Capturable: every draw is on the device, none reads the step."""

    capturable = True

    def __init__(self, cfg, data: dict[str, torch.Tensor], device: torch.device):
        self.images = data["train_images"].to(device)  # (N, 28, 28) uint8
        self.index = class_index(data["train_labels"].to(device))  # built once: sampling by class
        self.test_images = data["test_images"].to(device)  # (M, 28, 28) uint8, the digits the recipes index
        self.curve_pairs = data["test_pairs"][:CURVE_RECIPES].to(device).long()  # (P', 2)
        self.curve_shifts = data["test_shifts"][:CURVE_RECIPES].to(device)  # (P', 2, 2)
        self.curve_labels = data["test_labels"].to(device).long()[self.curve_pairs]  # (P', 2)
        self.batch_size, self.max_shift = cfg.batch_size, cfg.max_shift
        self.examples_per_epoch = cfg.multimnist_epoch_size
        self.steps_per_epoch = self.examples_per_epoch // cfg.batch_size

    def epoch_order(self, generator: torch.Generator) -> None:
        return None  # every batch is drawn fresh

    def batch(self, order: None, step: int | torch.Tensor, generator: torch.Generator) -> Batch:
        pairs, shifts = sample_pairs(self.index, self.batch_size, self.max_shift, generator)  # (B, 2), (B, 2, 2)
        merged, digits = compose(self.images, pairs, shifts)  # (B, 36, 36), (B, 2, 36, 36)
        return Batch(to_float(merged), self.index.labels[pairs], digits.unsqueeze(2).float().div_(255))

    def test_error(self, model: torch.nn.Module, batch_size: int, amp: bool) -> float:
        preds = predict_pairs(model, self.test_images, self.curve_pairs, self.curve_shifts, batch_size, amp)
        return 100.0 * int((~pair_correct(preds, self.curve_labels)).sum()) / self.curve_labels.shape[0]


def prepare(params: Params, mnist: dict[str, torch.Tensor], out_dir: Path, figures_dir: Path) -> str:
    """The MultiMNIST test recipes over MNIST's test digits."""
    p = params.prepare
    recipes = prepare_multimnist(out_dir, mnist["test_images"], mnist["test_labels"],
                                 pairs_per_digit=p.multimnist_pairs_per_digit, max_shift=p.multimnist_max_shift,
                                 seed=p.multimnist_seed)
    return f"MultiMNIST: {len(recipes['pairs']):,} test recipes"


def configure(cfg, data_dir: Path):
    """``cfg`` as it is, once the test recipes in ``data_dir`` hold the shift it trains with: training draws
    its pairs with the shift the recipes were drawn with (prepare.multimnist_max_shift, which `planned`
    gave ``cfg`` and the recipes' metadata keeps), so a run cannot train on other pairs than its params,
    config.json and fingerprint say."""
    path = data_dir / f"{TEST_SETS[0]}.safetensors"
    shift = int(split_metadata(path)["max_shift"])
    if shift != cfg.max_shift:
        raise UserError(f"{path}'s MultiMNIST recipes shift digits by up to {shift} px, but prepare.multimnist_max_shift "
                        f"is {cfg.max_shift}: prepare the data again under these params with `dvc repro -f prepare`")
    return cfg


def planned(cfg, params):
    """`configure`'s shift as recipes prepared under ``params`` hold it."""
    return dataclasses.replace(cfg, max_shift=params.prepare.multimnist_max_shift)


def training_data(data_dir: Path, cfg) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """MNIST's training digits (the pairs are drawn from them) and the test recipes with the 28×28
    test digits they index."""
    return base.training_data(TEST_SETS[0], data_dir, cfg, test_extras=("pairs", "shifts"))


def synthetic_data(cfg, n: int, device: torch.device) -> dict[str, torch.Tensor]:
    """n random digits, and recipes pairing each with the next (labels differ)."""
    digits = torch.randint(0, 256, (n, MNIST_SIZE, MNIST_SIZE), dtype=torch.uint8, device=device)
    labels = torch.arange(n, device=device) % cfg.num_classes
    return {"train_images": digits, "train_labels": labels, "test_images": digits, "test_labels": labels,
            "test_pairs": torch.stack([torch.arange(n), (torch.arange(n) + 1) % n], dim=1),
            "test_shifts": torch.zeros(n, 2, 2, dtype=torch.int8)}


def examples_per_epoch(cfg, n_train: int) -> int:
    """Every example is drawn fresh: an epoch is train.multimnist_epoch_size of them."""
    return cfg.multimnist_epoch_size


def evaluate(model: torch.nn.Module, cfg, data_dir: Path, out: Path) -> Evaluation:
    """MultiMNIST (§6): pair error on every test recipe, composed on the device batch by batch.

    metrics.json has no transformed set (MultiMNIST has none); breakdown.json adds the share of
    pairs with at least one digit right (the official code's "almost correct"); predictions hold the
    true and predicted pairs (P, 2), sorted, as uint8; confusion.png is the per-digit confusion
    (`digit_confusion`); reconstruction variants get reconstructions.png, the Fig. 5 overlay of the
    two predicted capsules' reconstructions for a few pairs and one failure.
    """
    path = data_dir / f"{TEST_SETS[0]}.safetensors"
    split, meta = load_split(path), split_metadata(path)
    if "pairs" not in split or "shifts" not in split:
        raise UserError(f"{path} holds no MultiMNIST recipes; rebuild it with `dvc repro -f prepare`")
    predicted = predict_pairs(model, split["images"], split["pairs"], split["shifts"], cfg.eval_batch_size).cpu()  # (P, 2)
    truth = split["labels"].long()[split["pairs"].long()].sort(dim=1).values  # (P, 2)
    correct = pair_correct(predicted, truth)  # (P,)
    one_right = (truth[:, :, None] == predicted[:, None, :]).any(dim=2).any(dim=1)  # (P,)
    n = int(truth.shape[0])
    metrics = {"error_pct": 100.0 * int((~correct).sum()) / n, "n_test": n}
    breakdown = {"per_class": {}, "sources": {TEST_SETS[0]: meta.get("source", TEST_SETS[0])}, "bins": {},
                 "at_least_one_right_pct": 100.0 * float(one_right.float().mean())}
    with atomic_path(out / "predictions.safetensors") as tmp:
        save_file({f"{TEST_SETS[0]}_labels": truth.to(torch.uint8), f"{TEST_SETS[0]}_preds": predicted.to(torch.uint8)},
                  str(tmp))
    write_json(out / "breakdown.json", breakdown)
    title = f"{cfg.variant} seed {cfg.seed}"
    figures.confusion([(digit_confusion(predicted, truth, cfg.num_classes).tolist(), "MultiMNIST, per digit")],
                      title, run_figure(out, "confusion.png"))
    if cfg.reconstruction:
        shown = torch.cat([torch.nonzero(correct).flatten()[:5], torch.nonzero(~correct).flatten()[:1]])  # (≤6,)
        merged, _ = compose(split["images"], split["pairs"][shown], split["shifts"][shown])  # (k, 36, 36)
        recons = reconstruct_pairs(model, merged, predicted[shown])  # (k, 2, 36, 36)
        titles = [f"{'' if bool(correct[i]) else 'FAIL '}true {tuple(truth[i].tolist())}\n"
                  f"red {int(predicted[i, 0])}, green {int(predicted[i, 1])}" for i in shown.tolist()]
        figures.multimnist_reconstructions(merged, recons, titles, f"{title}: reconstructions from the two "
                                           "predicted capsules", run_figure(out, "reconstructions.png"))
    return Evaluation(metrics, {f"eval_{TEST_SETS[0]}_error_pct": metrics["error_pct"]}, ["breakdown.json"],
                      [dataset_input(path, split, "evaluation")])


def deviations_of(p: Params) -> list[str]:
    """MultiMNIST's deviations, whenever params list a MultiMNIST variant: its CNN's, its sampling and
    curves', a test set smaller than the paper's."""
    if not any(p.variant(v).experiment == NAME for v in p.ablation.variants):
        return []
    return (baseline.MULTIMNIST_DEVIATIONS + DEVIATIONS
            + rm.test_size_deviation(p.prepare.multimnist_pairs_per_digit, p.prepare.test_subset))


def report(runs: list[Run], ctx: Context) -> Section:
    """MultiMNIST's section: Table 1 with both columns (its pair error beside the MNIST rows Table
    1's section left in ``ctx.shared``), the Fig. 5 reconstructions of the best variant,
    multimnist.csv; its deviations whenever params list a MultiMNIST variant."""
    deviations = deviations_of(ctx.params)
    table = rm.multimnist_summary(runs, ctx.reference) if runs else None
    shown = rm.figure(runs, table, ctx.results_dir, ctx.fig_dir)
    if not runs:
        return Section(tables={"multimnist.csv": ""}, deviations=deviations)
    lines = rm.render_both_columns(ctx.shared.get("table1", pd.DataFrame()), table, ctx.reference)
    return Section(lines=lines, figures=shown, deviations=deviations,
                   tables={"multimnist.csv": table.to_csv(index=False, float_format="%.4f")})


def readme(out: Path) -> list[str]:
    """None: MultiMNIST's numbers are in the report (no README line yet)."""
    return []
