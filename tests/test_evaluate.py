"""Evaluation arithmetic on hand-made predictions."""

import pytest
import torch

from pipeline.training.evaluate import accuracy_by_bins, confusion_matrix

RANGES = {"max_rotation_deg": 20.0, "max_shear": 0.2, "min_scale": 0.8, "max_scale": 1.2}


def test_accuracy_by_bins_on_a_hand_computed_example():
    # rotations −15°, −5°, −5°, 5°, 15°, 19.9° with correct = 1, 0, 1, 1, 0, 0; 4 bins of 10° over [−20, 20]
    params = torch.zeros(6, 6)
    params[:, 0] = torch.tensor([-15.0, -5.0, -5.0, 5.0, 15.0, 19.9])
    params[:, 1] = torch.tensor([-0.19, -0.19, -0.05, 0.05, 0.19, 0.19])
    params[:, 2:4] = 0.95
    correct = torch.tensor([True, False, True, True, False, False])
    bins = accuracy_by_bins(correct, params, RANGES, n_bins=4)
    rot = bins["rotation_deg"]
    assert rot["edges"] == [-20.0, -10.0, 0.0, 10.0, 20.0]
    assert rot["count"] == [1, 2, 1, 2]
    assert rot["accuracy_pct"] == pytest.approx([100.0, 50.0, 100.0, 0.0])
    assert bins["shear"]["count"] == [2, 1, 1, 2]
    assert bins["shear"]["accuracy_pct"] == pytest.approx([50.0, 100.0, 100.0, 0.0])
    assert bins["scale_x"]["count"] == [0, 6, 0, 0] and bins["scale_x"]["accuracy_pct"][0] is None


def test_confusion_matrix_rows_are_true_classes():
    cm = confusion_matrix(torch.tensor([0, 0, 1, 2]), torch.tensor([0, 1, 1, 1]), 3)
    assert cm.tolist() == [[1, 1, 0], [0, 1, 0], [0, 1, 0]]
