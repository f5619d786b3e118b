"""A tiny Fashion-MNIST-style experiment that tests/test_extension.py registers: one module, as a new
file under pipeline/experiments/ would be, with its own synthetic 28×28 data (each class a bar at its
own place), its own test sets, evaluation and report section. A module of its own, not one built in
a test, so that the training fingerprint's own process imports it by name as it would a plug-in."""

import pandas as pd
import torch

from pipeline.data.splits import load_split, save_split
from pipeline.experiments import base, table1
from pipeline.report.document import Section

NAME = "fashion_bars"
N_TRAIN, N_TEST = 40, 20


def bars(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n 28×28 uint8 images: class k is a bright horizontal bar at rows 2k+3..2k+4, with noise."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 10
    images = torch.randint(0, 40, (n, 28, 28), generator=g, dtype=torch.uint8)
    for i, k in enumerate(labels.tolist()):
        images[i, 2 * k + 3:2 * k + 5, 4:24] = 255
    return images, labels.to(torch.uint8)


def prepare(params, mnist, out_dir, figures_dir) -> str:
    """Its own sets, not MNIST's: a training split, a test split and the test split upside down."""
    train_images, train_labels = bars(N_TRAIN, 1)
    test_images, test_labels = bars(N_TEST, 2)
    save_split(out_dir / f"{NAME}_train.safetensors", train_images, train_labels, {"source": "synthetic bars"})
    save_split(out_dir / f"{NAME}_test.safetensors", test_images, test_labels, {"source": "synthetic bars"})
    save_split(out_dir / f"{NAME}_flipped.safetensors", test_images.flip(1), test_labels, {"source": "upside down"})
    return f"{NAME}: {N_TRAIN} + {N_TEST} bars"


def training_data(data_dir, cfg):
    train, test = (load_split(data_dir / f"{NAME}_{s}.safetensors") for s in ("train", "test"))
    data = {"train_images": train["images"], "train_labels": train["labels"],
            "test_images": test["images"], "test_labels": test["labels"]}
    return data, []


def evaluate(model, cfg, data_dir, out):
    return base.evaluate_sets(TEST_SETS, model, cfg, data_dir, out)


def report(runs, ctx) -> Section:
    rows = pd.DataFrame([{"variant": r.variant, "seed": r.seed, "error_pct": r.metrics["error_pct"]} for r in runs],
                        columns=["variant", "seed", "error_pct"])
    lines = ["## Bars (an extension)", "", *(f"- {r.variant} seed {r.seed}: {r.error_pct:.2f} %" for r in rows.itertuples())]
    return Section(lines=lines if runs else [], tables={f"{NAME}.csv": rows.to_csv(index=False)})


TEST_SETS = (f"{NAME}_test", f"{NAME}_flipped")
IMAGE_SIZE, MODELS, CPU_EPOCH_SECONDS, CURVES = 28, ("capsnet",), {}, "Bars"
configure, planned, Training, synthetic_data = base.configure, base.planned, table1.Training, table1.synthetic_data
examples_per_epoch = base.examples_per_epoch


def readme(out) -> list[str]:
    return []
