"""§5.2 data: canvas placement, expanded MNIST, the affNIST-style set and the .mat loader."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.io import savemat

from conftest import committed_params, synthetic_digits
from pipeline.data.splits import load_split, split_metadata
from pipeline.data.transforms import AffineRanges, translation_bounds
from pipeline.experiments import affnist
from pipeline.experiments.affnist import (
    CANVAS, AffnistError, affnist_style, expanded_mnist, load_affnist_mat, place_on_canvas, prepare_affnist,
    random_offsets, random_place,
)


def test_placement_puts_the_digit_at_its_offset_and_nothing_else():
    digit = torch.arange(28 * 28, dtype=torch.int64).view(1, 28, 28) % 251 + 1  # no zero pixel: every pixel is ink
    for dy, dx in [(0, 0), (12, 12), (3, 9), (12, 0)]:
        canvas = place_on_canvas(digit, torch.tensor([[dy, dx]]))[0]
        assert canvas.shape == (CANVAS, CANVAS)
        assert torch.equal(canvas[dy:dy + 28, dx:dx + 28], digit[0])  # fully inside, unchanged
        assert canvas.sum() == digit.sum()  # and nothing else on the canvas
    with pytest.raises(ValueError, match="28×28 digits do not fit on a 20×20 canvas"):
        place_on_canvas(digit, torch.tensor([[0, 0]]), canvas=20)  # would cut the digit's ink


def test_random_offsets_cover_every_position_and_stay_inside():
    offsets = random_offsets(20_000, 28, CANVAS, torch.Generator().manual_seed(0))
    assert offsets.min() == 0 and offsets.max() == CANVAS - 28
    positions = set(map(tuple, offsets.tolist()))
    assert len(positions) == (CANVAS - 28 + 1) ** 2  # all 169 offsets occur


def test_random_place_keeps_every_digit_whole():
    images, _ = synthetic_digits(64)
    placed = random_place(images, CANVAS, torch.Generator().manual_seed(1))
    assert placed.shape == (64, CANVAS, CANVAS) and placed.dtype == torch.uint8
    assert torch.equal(placed.flatten(1).long().sum(1), images.flatten(1).long().sum(1))


def test_expanded_mnist_is_deterministic_in_its_seed():
    images, _ = synthetic_digits(20)
    a, offsets_a = expanded_mnist(images, seed=5)
    b, offsets_b = expanded_mnist(images, seed=5)
    c, _ = expanded_mnist(images, seed=6)
    assert torch.equal(a, b) and torch.equal(offsets_a, offsets_b) and not torch.equal(a, c)
    assert torch.equal(a.flatten(1).long().sum(1), images.flatten(1).long().sum(1))


def test_affnist_style_params_in_range_digits_inside_and_deterministic():
    images, labels = synthetic_digits(30)
    ranges = AffineRanges()
    out = affnist_style(images, labels, transforms_per_digit=4, seed=3, ranges=ranges)
    assert out["images"].shape == (120, CANVAS, CANVAS) and out["images"].dtype == torch.uint8
    assert torch.equal(out["labels"], labels.repeat_interleave(4))
    assert out["digit_index"].tolist()[:8] == [0, 0, 0, 0, 1, 1, 1, 1]
    p = out["affine_params"]
    assert p[:, 0].abs().max() <= 20 and p[:, 1].abs().max() <= 0.2
    assert p[:, 2:4].min() >= 0.8 and p[:, 2:4].max() <= 1.2
    # each translation lies in the range that keeps the transformed ink box inside the canvas
    centred = place_on_canvas(images, torch.full((30, 2), 6)).repeat_interleave(4, dim=0)
    from pipeline.data.transforms import _linear_part

    lo, hi = translation_bounds(centred, _linear_part(p))
    assert (p[:, 4:6] >= lo - 1e-4).all() and (p[:, 4:6] <= hi + 1e-4).all()
    # nothing was cut off: each warped digit keeps its ink, scaled by the transform's area factor sx·sy
    mass_in = centred.flatten(1).double().sum(1) * p[:, 2].double() * p[:, 3].double()
    mass_out = out["images"].flatten(1).double().sum(1)
    assert ((mass_out / mass_in - 1).abs() < 0.05).all()
    again = affnist_style(images, labels, transforms_per_digit=4, seed=3, ranges=ranges)
    assert torch.equal(again["images"], out["images"]) and torch.equal(again["affine_params"], p)
    assert not torch.equal(affnist_style(images, labels, 4, seed=4, ranges=ranges)["images"], out["images"])


def _write_affnist_mat(path, images: torch.Tensor, labels: torch.Tensor) -> None:
    """affNIST's layout: struct affNISTdata, image 1600 × N (one row-major 40×40 image per column)."""
    columns = images.reshape(images.shape[0], -1).numpy().T  # (1600, N)
    savemat(str(path), {"affNISTdata": {"image": columns, "label_int": labels.numpy().astype(np.uint8)}})


def test_mat_loader_reads_a_file_and_a_folder_of_batches_in_order(tmp_path):
    images = torch.zeros(5, CANVAS, CANVAS, dtype=torch.uint8)
    for k in range(5):
        images[k, k, :10 + k] = 200 + k  # an asymmetric mark: a transposed read would put it in a column
    labels = torch.tensor([3, 1, 4, 1, 5], dtype=torch.uint8)
    _write_affnist_mat(tmp_path / "test.mat", images, labels)
    got_images, got_labels = load_affnist_mat(tmp_path / "test.mat")
    assert torch.equal(got_images, images) and torch.equal(got_labels, labels)
    batches = tmp_path / "test_batches"
    batches.mkdir()
    for name, sl in (("1.mat", slice(0, 1)), ("2.mat", slice(1, 3)), ("10.mat", slice(3, 5))):  # 10 after 2
        _write_affnist_mat(batches / name, images[sl], labels[sl])
    got_images, got_labels = load_affnist_mat(batches)
    assert torch.equal(got_images, images) and torch.equal(got_labels, labels)


def test_mat_loader_names_what_is_wrong(tmp_path):
    savemat(str(tmp_path / "bad.mat"), {"something": np.zeros(3)})
    with pytest.raises(AffnistError, match="bad.mat: expected a struct affNISTdata"):
        load_affnist_mat(tmp_path / "bad.mat")
    savemat(str(tmp_path / "labels.mat"), {"affNISTdata": {"image": np.zeros((1600, 2), np.uint8),
                                                          "label_int": np.array([1, 12], np.uint8)}})
    with pytest.raises(AffnistError, match="labels 0-9"):
        load_affnist_mat(tmp_path / "labels.mat")
    pixels = np.zeros((1600, 2), np.int16)
    pixels[5, 1] = 300  # read as uint8 it would be 44: a bright stroke made faint
    savemat(str(tmp_path / "pixels.mat"), {"affNISTdata": {"image": pixels, "label_int": np.array([1, 2], np.uint8)}})
    with pytest.raises(AffnistError, match="pixels.mat: pixels must be 0-255"):
        load_affnist_mat(tmp_path / "pixels.mat")
    with pytest.raises(AffnistError, match="does not exist"):
        load_affnist_mat(tmp_path / "nowhere")
    savemat(str(tmp_path / "counts.mat"), {"affNISTdata": {"image": np.zeros((1600, 3), np.uint8),
                                                          "label_int": np.array([1, 2], np.uint8)}})
    with pytest.raises(AffnistError, match="counts.mat: 3 images but 2 labels"):
        load_affnist_mat(tmp_path / "counts.mat")
    whole = (tmp_path / "counts.mat").read_bytes()
    for cut in (0, 100, 127, 1000):  # a download cut short: scipy raises MatReadError, IndexError, TypeError, OSError
        (tmp_path / "torn.mat").write_bytes(whole[:cut])
        with pytest.raises(AffnistError, match=r"torn.mat: not a readable Matlab file \(.*\); download it again"):
            load_affnist_mat(tmp_path / "torn.mat")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AffnistError, match="empty holds no .mat files"):
        load_affnist_mat(tmp_path / "empty")


def test_prepare_uses_the_real_affnist_when_a_mirror_is_given(tmp_path):
    images, labels = synthetic_digits(6)
    kwargs = dict(expanded_seed=1, affnist_seed=2, transforms_per_digit=2, ranges=AffineRanges())
    generated = prepare_affnist(tmp_path / "gen", images, labels, **kwargs)
    assert "affNIST-style" in split_metadata(tmp_path / "gen" / "affnist_test.safetensors")["source"]
    assert load_split(tmp_path / "gen" / "affnist_test.safetensors")["images"].shape == (12, CANVAS, CANVAS)
    assert generated["expanded"].shape == (6, CANVAS, CANVAS)
    real = torch.randint(0, 256, (7, CANVAS, CANVAS), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    _write_affnist_mat(tmp_path / "test.mat", real, torch.arange(7, dtype=torch.uint8))
    prepare_affnist(tmp_path / "real", images, labels, mirror=tmp_path / "test.mat", **kwargs)
    split = load_split(tmp_path / "real" / "affnist_test.safetensors")
    assert torch.equal(split["images"], real) and "affine_params" not in split
    assert split_metadata(tmp_path / "real" / "affnist_test.safetensors")["source"].startswith("affNIST test set (7 images")


def test_prepare_writes_the_offsets_source_digits_and_ranges_that_evaluation_and_the_report_read(tmp_path):
    images, labels = synthetic_digits(6)
    ranges = AffineRanges()
    prepare_affnist(tmp_path, images, labels, expanded_seed=1, affnist_seed=2, transforms_per_digit=3, ranges=ranges)
    expanded, offsets = expanded_mnist(images, 1)  # its own seed, not the affNIST-style set's
    written = load_split(tmp_path / "expanded_test.safetensors")
    assert torch.equal(written["images"], expanded) and torch.equal(written["offsets"], offsets)
    affine = load_split(tmp_path / "affnist_test.safetensors")
    assert torch.equal(affine["digit_index"], torch.arange(6).repeat_interleave(3))  # the gap resamples whole digits
    assert json.loads(split_metadata(tmp_path / "affnist_test.safetensors")["ranges"]) == dataclasses.asdict(ranges)


def test_the_mirror_variable_is_a_path_with_home_expanded_and_blank_means_unset(monkeypatch):
    monkeypatch.setenv(affnist.AFFNIST_MIRROR_ENV, "  ")
    assert affnist.affnist_mirror() is None
    monkeypatch.setenv(affnist.AFFNIST_MIRROR_ENV, "~/affnist/test.mat ")
    assert affnist.affnist_mirror() == Path.home() / "affnist" / "test.mat"


def test_prepare_draws_the_first_transform_of_montage_count_digits_and_says_what_it_wrote(tmp_path, monkeypatch):
    drawn = {}
    monkeypatch.setattr(affnist.figures, "affine_montage", lambda *args, **kw: drawn.update(args=args, kw=kw))
    monkeypatch.delenv(affnist.AFFNIST_MIRROR_ENV, raising=False)
    params = committed_params(affnist_transforms=3, montage_count=4)
    images, labels = synthetic_digits(6)
    said = affnist.prepare(params, {"test_images": images, "test_labels": labels}, tmp_path, tmp_path)
    assert said == ("6 expanded (40×40); affNIST-style set (generated: 3 transform(s) per test digit, seed 2; not the "
                    "real affNIST): 18 images")
    originals, shown, transforms, path = drawn["args"]
    affine = load_split(tmp_path / "affnist_test.safetensors")
    assert torch.equal(originals, load_split(tmp_path / "expanded_test.safetensors")["images"][:4])
    assert torch.equal(shown, affine["images"][::3][:4]) and torch.equal(transforms, affine["affine_params"][::3][:4])
    assert path == tmp_path / affnist.MONTAGE


def test_a_report_without_runs_keeps_the_sets_deviation(tmp_path):
    from pipeline.report.document import Context
    from pipeline.report.runs import paper_reference

    params = committed_params(affnist_transforms=3)
    (tmp_path / "figures").mkdir()
    section = affnist.report([], Context(params, paper_reference(), [], tmp_path / "results", tmp_path))
    assert section.deviations == ["affNIST-style set: 3 transform(s) per test digit (affNIST has 32; "
                                  "prepare.affnist_transforms)."]
    assert section.tables == {"affnist.csv": ""} and (tmp_path / "figures" / "affnist_bins.png").is_file()
