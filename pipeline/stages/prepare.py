"""Stage `prepare`: verified raw MNIST to the prepared tensors every later stage reads.

The raw files are checked against MNIST's SHA-256 before decoding (a byte changed after download
is an error, never silent corruption); then train/test/affine_test (28×28) and §5.2's
expanded_test/affnist_test (40×40) and MultiMNIST's test recipes (multimnist_test: the test digits
and the pairs and shifts to compose, never pixels) are written, each atomically, with two montages.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.data import download
from pipeline.experiments.affnist import affnist_mirror, prepare_affnist
from pipeline.data.mnist import AffineRanges, IdxError, prepare
from pipeline.core.errors import UserError
from pipeline.report.figures import affine_montage
from pipeline.experiments.multimnist import prepare_multimnist
from pipeline.core.params import Params


def verify_raw(raw_dir: Path) -> None:
    """Every MNIST file in ``raw_dir`` has the SHA-256 `download` verified it against."""
    for name, expected in download.SHA256.items():
        path = raw_dir / name
        if not path.is_file():
            raise UserError(f"{path} is missing; fetch MNIST with `dvc repro download` (or `capsnet download {raw_dir}`)")
        actual = download.sha256_file(path)
        if actual != expected:
            raise UserError(f"{path} changed after download (SHA-256 {actual[:12]}…, MNIST's is {expected[:12]}…); "
                            "restore it with `dvc repro -f download`")


def run(params: Params, raw_dir: Path, out_dir: Path, montage: Path, affnist_montage: Path) -> str:
    """Prepare every split and both montages; returns a one-line summary."""
    p = params.prepare
    verify_raw(raw_dir)
    ranges = AffineRanges(p.max_rotation_deg, p.max_shear, p.min_scale, p.max_scale)
    try:
        out = prepare(raw_dir, out_dir, train_subset=p.train_subset, test_subset=p.test_subset,
                      affine_seed=p.affine_seed, ranges=ranges)
    except IdxError as err:
        raise UserError(f"{err}. Re-run `dvc repro -f download` to fetch clean files.") from err
    s52 = prepare_affnist(out_dir, out["test_images"], out["test_labels"], expanded_seed=p.expanded_seed,
                          affnist_seed=p.affnist_seed, transforms_per_digit=p.affnist_transforms, ranges=ranges,
                          mirror=affnist_mirror())
    recipes = prepare_multimnist(out_dir, out["test_images"], out["test_labels"],
                                 pairs_per_digit=p.multimnist_pairs_per_digit, max_shift=p.multimnist_max_shift,
                                 seed=p.multimnist_seed)
    n = out["test_images"].shape[0]
    k = min(p.montage_count, n)
    affine_montage(out["test_images"][:k], out["affine_images"][:k], out["affine_params"][:k], montage)
    transforms = s52.get("affine_params")  # None for the real affNIST
    step = p.affnist_transforms if transforms is not None else 1  # the first transform of each digit
    shown = s52["images"][::step][:k]
    affine_montage(s52["expanded"][:len(shown)], shown, None if transforms is None else transforms[::step][:k],
                   affnist_montage, labels=("expanded", "affNIST"), title=f"§5.2 test sets: {s52['source']}")
    return (f"prepared {out_dir}: {n} test digits, {n} affine-shifted, {n} expanded (40×40); "
            f"{s52['source']}: {len(s52['labels']):,} images; MultiMNIST: {len(recipes['pairs']):,} test recipes; "
            f"montages {montage}, {affnist_montage}")
