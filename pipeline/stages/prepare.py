"""Stage `prepare`: verified raw MNIST to the prepared tensors every later stage reads.

The raw files are checked against MNIST's SHA-256 before decoding (a byte changed after download
is an error, never silent corruption); MNIST's train and test splits are written, then every
experiment (pipeline.core.registry, each module's `prepare`) writes its own test sets from them,
each atomically, and its montage into the figures folder.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core import registry
from pipeline.core.errors import UserError
from pipeline.core.params import Params
from pipeline.data import download
from pipeline.data.idx import IdxError
from pipeline.data.splits import prepare_mnist


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


def run(params: Params, raw_dir: Path, out_dir: Path, figures_dir: Path) -> str:
    """Prepare MNIST's splits and every experiment's sets and montage; returns a one-line summary."""
    p = params.prepare
    verify_raw(raw_dir)
    try:
        mnist = prepare_mnist(raw_dir, out_dir, train_subset=p.train_subset, test_subset=p.test_subset)
    except IdxError as err:
        raise UserError(f"{err}. Re-run `dvc repro -f download` to fetch clean files.") from err
    figures_dir.mkdir(parents=True, exist_ok=True)
    parts = [registry.load(name).prepare(params, mnist, out_dir, figures_dir) for name in registry.names()]
    return f"prepared {out_dir}: {len(mnist['test_images'])} test digits, {'; '.join(parts)}; montages in {figures_dir}"
