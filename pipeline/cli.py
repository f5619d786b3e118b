"""The `capsnet` command: one subcommand per DVC stage. Paths come from dvc.yaml's command lines."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pipeline.params import ParamsError, load_params

PARAMS_OPTION = click.option("--params", "params_path", default="params.yaml", show_default=True,
                             type=click.Path(dir_okay=False), help="params.yaml to read")


def _params(path: str):
    try:
        return load_params(path)
    except ParamsError as err:
        raise click.ClickException(str(err)) from err


@click.group()
def main() -> None:
    """capsnet-repro: reproduce Table 1 of Dynamic Routing Between Capsules (Sabour et al. 2017)."""


@main.command()
@click.argument("dest", type=click.Path(file_okay=False))
def download(dest: str) -> None:
    """Fetch the four MNIST IDX files into DEST, verified by SHA-256.

    Sources: $CAPSNET_MNIST_MIRROR (a directory or URL base, files gz or raw), then torchvision's
    public mirrors.
    """
    from pipeline.download import DownloadError, download_mnist

    try:
        hashes = download_mnist(dest)
    except DownloadError as err:
        raise click.ClickException(str(err)) from err
    for name, digest in hashes.items():
        click.echo(f"{name}  sha256 {digest}  ok")


@main.command()
@click.argument("raw_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--montage", type=click.Path(dir_okay=False), required=True,
              help="PNG: originals above their affine-shifted versions")
@PARAMS_OPTION
def prepare(raw_dir: str, out_dir: str, montage: str, params_path: str) -> None:
    """Decode RAW_DIR's IDX files into uint8 tensors in OUT_DIR and build the affine-shifted test set."""
    from pipeline.data import AffineRanges, IdxError, prepare as prepare_data
    from pipeline.figures import affine_montage

    p = _params(params_path).prepare
    ranges = AffineRanges(p.max_rotation_deg, p.max_shear, p.min_scale, p.max_scale)
    try:
        out = prepare_data(raw_dir, out_dir, train_subset=p.train_subset, test_subset=p.test_subset,
                           affine_seed=p.affine_seed, ranges=ranges)
    except (IdxError, FileNotFoundError) as err:
        raise click.ClickException(f"{err}. Re-run `dvc repro -f download` to fetch clean files.") from err
    k = min(p.montage_count, out["test_images"].shape[0])
    affine_montage(out["test_images"][:k], out["affine_images"][:k], out["affine_params"][:k], montage)
    n = out["test_images"].shape[0]
    click.echo(f"prepared {out_dir}: {n} test digits, {n} affine-shifted; montage {montage}")


if __name__ == "__main__":
    sys.exit(main())
