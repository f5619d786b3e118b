"""§5.2's data: digits on a 40×40 canvas, the expanded-MNIST and affNIST-style test sets, and a
loader for the real affNIST test files.

- Training (§5.2): each MNIST training digit at a uniformly random position on a black 40×40
  canvas, drawn per step on the device (`random_place`); no other augmentation.
- Expanded MNIST: the 10k test digits placed the same way, deterministic from a seed.
- affNIST-style: every test digit under K random affine transforms (affNIST has K = 32) with
  affNIST's ranges, on the 40×40 canvas, the translation keeping the digit's ink inside. Like
  affNIST, the digit is first centred on the canvas (a 6-pixel edge), then transformed.
- The real affNIST test set (cs.toronto.edu/~tijmen/affNIST, Matlab .mat) replaces the
  affNIST-style set when $CAPSNET_AFFNIST_MIRROR points at its file(s); the report names the set.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import torch

from pipeline.core.errors import UserError
from pipeline.core.params import Params
from pipeline.data.splits import save_split
from pipeline.data.transforms import AffineRanges, apply_affine, ranges_metadata, sample_affine_params, translate
from pipeline.experiments import affnist_report as ra
from pipeline.experiments import base, table1
from pipeline.experiments.affnist_report import REAL_AFFNIST
from pipeline.experiments.base import configure, examples_per_epoch, planned  # noqa: F401 (this experiment's, as they are)
from pipeline.report import claims as rc
from pipeline.report import figures
from pipeline.report.document import Context, Section, fmt_ci, fmt_pct
from pipeline.report.runs import Run, read_table

NAME = "affnist"
CANVAS = IMAGE_SIZE = 40  # §5.2 and affNIST: 40×40 images
MODELS = ("capsnet", "baseline_cnn", "pooling_cnn")
TEST_SETS = ("expanded_test", "affnist_test")
MONTAGE = "affnist_montage.png"
CURVES = "expanded-MNIST test set (§5.2, 40×40)"  # its panel of the learning curves
# scaled from Table 1's CapsNet measurement by the FLOP per training image `capsnet bench` counts
CPU_EPOCH_SECONDS = {"capsnet": 2_370, "pooling_cnn": 2_270}
AFFNIST_MIRROR_ENV = "CAPSNET_AFFNIST_MIRROR"


class AffnistError(UserError, ValueError):
    """An affNIST .mat file is missing or malformed; the message names the file and the problem."""


def place_on_canvas(images: torch.Tensor, offsets: torch.Tensor, canvas: int = CANVAS) -> torch.Tensor:
    """Put each (H, W) digit on a black canvas with its top-left corner at (dy, dx).

    images (B, H, W), offsets (B, 2) integer rows/columns in [0, canvas − H] × [0, canvas − W]
    -> (B, canvas, canvas), same dtype and device; one gather, no host synchronisation.
    """
    _, h, w = images.shape
    if h > canvas or w > canvas:
        raise ValueError(f"{h}×{w} digits do not fit on a {canvas}×{canvas} canvas")
    return translate(images, offsets, canvas)


def random_offsets(n: int, digit: int, canvas: int, generator: torch.Generator,
                   device: torch.device | str = "cpu") -> torch.Tensor:
    """(n, 2) top-left corners, uniform over all (canvas − digit + 1)² positions."""
    return torch.randint(0, canvas - digit + 1, (n, 2), generator=generator, device=device)


def random_place(images: torch.Tensor, canvas: int, generator: torch.Generator) -> torch.Tensor:
    """§5.2's training augmentation: each digit at a uniformly random canvas position.  (B, H, W) -> (B, C, C)"""
    offsets = random_offsets(images.shape[0], images.shape[1], canvas, generator, images.device)  # (B, 2)
    return place_on_canvas(images, offsets, canvas)


def expanded_mnist(images: torch.Tensor, seed: int, canvas: int = CANVAS) -> tuple[torch.Tensor, torch.Tensor]:
    """The expanded-MNIST test set: (N, C, C) uint8 and the offsets (N, 2), deterministic in seed."""
    offsets = random_offsets(images.shape[0], images.shape[1], canvas, torch.Generator().manual_seed(seed))
    return place_on_canvas(images, offsets, canvas), offsets


def affnist_style(images: torch.Tensor, labels: torch.Tensor, transforms_per_digit: int, seed: int,
                  ranges: AffineRanges, canvas: int = CANVAS, chunk: int = 16384) -> dict[str, torch.Tensor]:
    """Every digit under ``transforms_per_digit`` random affNIST-range transforms on the canvas.

    Returns images (N·K, C, C) uint8, labels (N·K,), affine_params (N·K, 6) (AFFINE_PARAM_NAMES,
    translation in pixels from the centred position) and digit_index (N·K,): row k·K + j is test
    digit k under its j-th transform. Deterministic in seed.
    """
    n, h, _ = images.shape
    centre = torch.full((n, 2), (canvas - h) // 2)
    centred = place_on_canvas(images, centre, canvas).repeat_interleave(transforms_per_digit, dim=0)  # (N·K, C, C)
    params = sample_affine_params(centred, ranges, torch.Generator().manual_seed(seed))  # (N·K, 6)
    warped = torch.cat([apply_affine(centred[s:s + chunk], params[s:s + chunk])
                        for s in range(0, centred.shape[0], chunk)])  # (N·K, C, C)
    return {"images": warped, "labels": labels.repeat_interleave(transforms_per_digit),
            "affine_params": params, "digit_index": torch.arange(n).repeat_interleave(transforms_per_digit)}


# --- the real affNIST test files -----------------------------------------------------------------


def _mat_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise AffnistError(f"${AFFNIST_MIRROR_ENV} = {path} does not exist; point it at affNIST's test.mat "
                           "or at a folder of its test batches (1.mat … 32.mat), or unset it")
    files = sorted(path.glob("*.mat"), key=lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.stem)])
    if not files:
        raise AffnistError(f"{path} holds no .mat files; expected affNIST's test.mat or its test batches")
    return files


def load_affnist_mat(path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (N, 40, 40) uint8 and labels (N,) uint8 from an affNIST .mat file or a folder of them.

    Each file holds a struct ``affNISTdata`` with ``image`` (1600 × N, one image per column, read
    row-major as 40×40 like affNIST's own loaders) and ``label_int`` (N). Read with scipy.io.loadmat.
    """
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    images, labels = [], []
    for file in _mat_files(Path(path)):
        try:
            mat = loadmat(str(file), squeeze_me=True, struct_as_record=False)
        except (MatReadError, ValueError, OSError, NotImplementedError, IndexError, TypeError) as err:
            # scipy's errors for a file that is not Matlab's (ValueError) or was cut short: empty
            # (MatReadError), inside its 128-byte header (IndexError, TypeError), further on (OSError)
            raise AffnistError(f"{file}: not a readable Matlab file ({err}); download it again, or unset "
                               f"${AFFNIST_MIRROR_ENV} to use the affNIST-style set") from err
        data = mat.get("affNISTdata")
        if data is None or not all(hasattr(data, f) for f in ("image", "label_int")):
            raise AffnistError(f"{file}: expected a struct affNISTdata with fields image (1600×N) and label_int (N)")
        image = np.asarray(data.image).reshape(CANVAS * CANVAS, -1)  # (1600, N)
        label = np.atleast_1d(np.asarray(data.label_int)).reshape(-1)  # (N,)
        if image.shape[1] != label.shape[0]:
            raise AffnistError(f"{file}: {image.shape[1]} images but {label.shape[0]} labels")
        if image.min() < 0 or image.max() > 255 or label.min() < 0 or label.max() > 9:
            raise AffnistError(f"{file}: pixels must be 0-255 and labels 0-9")
        images.append(torch.from_numpy(np.ascontiguousarray(image.T.reshape(-1, CANVAS, CANVAS).astype(np.uint8))))
        labels.append(torch.from_numpy(label.astype(np.uint8)))
    return torch.cat(images), torch.cat(labels)  # (N, 40, 40), (N,)


def affnist_mirror() -> Path | None:
    """$CAPSNET_AFFNIST_MIRROR as a path, or None when unset (then the affNIST-style set is used)."""
    value = os.environ.get(AFFNIST_MIRROR_ENV, "").strip()
    return Path(value).expanduser() if value else None


def prepare_affnist(out_dir: str | Path, test_images: torch.Tensor, test_labels: torch.Tensor, *, expanded_seed: int,
                    affnist_seed: int, transforms_per_digit: int, ranges: AffineRanges,
                    mirror: Path | None = None) -> dict[str, torch.Tensor | str]:
    """Write expanded_test.safetensors and affnist_test.safetensors (§5.2) into ``out_dir``.

    The affNIST set is the real one when ``mirror`` names affNIST's test file(s), else the
    affNIST-style set built from ``test_images``. Returns the tensors and the set's source line.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    expanded, offsets = expanded_mnist(test_images, expanded_seed)  # (N, 40, 40), (N, 2)
    save_split(out_dir / "expanded_test.safetensors", expanded, test_labels,
               {"source": f"expanded MNIST: test digits at uniform positions on {CANVAS}×{CANVAS} (seed {expanded_seed})"},
               offsets=offsets)
    if mirror is not None:
        images, labels = load_affnist_mat(mirror)
        source = f"{REAL_AFFNIST} ({len(labels):,} images from {mirror})"
        save_split(out_dir / "affnist_test.safetensors", images, labels, {"source": source})  # no transforms known
        return {"expanded": expanded, "images": images, "labels": labels, "source": source}
    out = affnist_style(test_images, test_labels, transforms_per_digit, affnist_seed, ranges)
    source = (f"affNIST-style set (generated: {transforms_per_digit} transform(s) per test digit, seed {affnist_seed}; "
              "not the real affNIST)")
    save_split(out_dir / "affnist_test.safetensors", out["images"], out["labels"], ranges_metadata(ranges, source),
               affine_params=out["affine_params"], digit_index=out["digit_index"])
    return {"expanded": expanded, **out, "source": source}


class Training(table1.Training):
    """§5.2's training (pipeline.training.experiment.Experiment): as Table 1's, but each digit goes to a
    uniformly random position on the image_size canvas instead of a ±2 px shift; scored each epoch
    on the expanded-MNIST test set (early stopping reads it, `train.target_reached`)."""

    def augment(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """(B, 28, 28) uint8 -> (B, C, C) with C = image_size."""
        return random_place(images, self.image_size, generator)


def prepare(params: Params, mnist: dict[str, torch.Tensor], out_dir: Path, figures_dir: Path) -> str:
    """Expanded MNIST and the affNIST(-style) set, and their montage (the first transform of each
    digit under its expanded original)."""
    p = params.prepare
    s52 = prepare_affnist(out_dir, mnist["test_images"], mnist["test_labels"], expanded_seed=p.expanded_seed,
                          affnist_seed=p.affnist_seed, transforms_per_digit=p.affnist_transforms,
                          ranges=table1.ranges(params), mirror=affnist_mirror())
    k = min(p.montage_count, len(mnist["test_images"]))
    transforms = s52.get("affine_params")  # None for the real affNIST
    step = p.affnist_transforms if transforms is not None else 1  # the first transform of each digit
    shown = s52["images"][::step][:k]
    figures.affine_montage(s52["expanded"][:len(shown)], shown, None if transforms is None else transforms[::step][:k],
                           figures_dir / MONTAGE, labels=("expanded", "affNIST"), title=f"§5.2 test sets: {s52['source']}")
    return f"{len(s52['expanded'])} expanded (40×40); {s52['source']}: {len(s52['labels']):,} images"


def training_data(data_dir: Path, cfg) -> tuple[dict[str, torch.Tensor], list[dict]]:
    return base.training_data(TEST_SETS[0], data_dir, cfg)


def synthetic_data(cfg, n: int, device: torch.device) -> dict[str, torch.Tensor]:
    return base.synthetic_data(cfg, n, device, IMAGE_SIZE)


def evaluate(model: torch.nn.Module, cfg, data_dir: Path, out: Path) -> base.Evaluation:
    """Expanded MNIST and the affNIST(-style) set (`base.evaluate_sets`)."""
    return base.evaluate_sets(TEST_SETS, model, cfg, data_dir, out)


def deviations_of(p: Params) -> list[str]:
    """§5.2's deviations from the profile: an affNIST-style set with fewer transforms than affNIST's 32."""
    if p.prepare.affnist_transforms == 32:
        return []
    return [f"affNIST-style set: {p.prepare.affnist_transforms} transform(s) per test digit "
            "(affNIST has 32; prepare.affnist_transforms)."]


def report(runs: list[Run], ctx: Context) -> Section:
    """§5.2's section: both models' expanded-MNIST and affNIST(-style) accuracy against the paper's,
    the CapsNet − CNN gap with its interval and claim, accuracy by transform parameter, the montage,
    affnist.csv; the gap as a headline metric."""
    bins = ctx.fig_dir / "affnist_bins.png"
    if not runs:
        figures.placeholder("No §5.2 (40×40) variant in this report", bins)
        return Section(tables={"affnist.csv": ""}, deviations=deviations_of(ctx.params))
    gap = ra.affnist_gap(runs, ctx.reference, ctx.bench)
    table = ra.with_gap(ra.affnist_summary(runs, ctx.reference), gap)
    shown = {"§5.2 test sets": f"figures/{MONTAGE}"} if (ctx.fig_dir / MONTAGE).is_file() else {}
    figures.accuracy_by_transform(ra.transform_bins(ra.headline_runs(runs), TEST_SETS[1]),
                                  "§5.2: affNIST(-style) accuracy by transform parameter", bins)
    shown["§5.2: accuracy by transform parameter"] = f"figures/{bins.name}"
    return Section(lines=ra.render_affnist(table, gap, ctx.reference), deviations=deviations_of(ctx.params),
                   claims=rc.gap_claim(gap) if gap is not None else None, figures=shown,
                   tables={"affnist.csv": table.to_csv(index=False, float_format="%.4f")},
                   headline={} if gap is None else {"affnist_gap_pp": {k: round(gap[k], 4) for k in
                                                                       ("gap", "ci_low", "ci_high")}})


def readme(out: Path) -> list[str]:
    """Its line of the README's results block, from affnist.csv as written: the gap and both models'
    affNIST(-style) accuracy."""
    if not (out / "affnist.csv").stat().st_size:
        return []
    table = read_table(out / "affnist.csv")
    if not len(table) or "gap_pp" not in table:
        return []
    g = table.iloc[0]
    shown = table[table.protocol == g.gap_protocol]  # the rows the gap reads
    shown = shown if len(shown) else table  # a confounded gap reads several protocols
    return [f"§5.2, CapsNet − CNN accuracy on the {ra.set_name(g.affnist_source)}: {g.gap_pp:+.2f} pp "
            f"{fmt_ci(g.gap_ci_low, g.gap_ci_high)}, **{g.gap_verdict}** (paper {g.paper_gap_pp:+.0f} pp on the real "
            "affNIST); " + "; ".join(f"{r.variant} {r.affnist_acc_mean:.1f} ± {fmt_pct(r.affnist_acc_std, 1)} %"
                                    for r in shown.itertuples()) + "."]
