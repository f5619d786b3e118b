"""Evaluation arithmetic on hand-made predictions."""

import pytest
import torch

from pipeline.report.runs import uniform_metrics
from pipeline.training.evaluate import accuracy_by_bins, confusion_matrix, error_pct

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


def test_an_error_rate_is_its_count_over_n_written_and_read():
    """39 of 10,000 wrong is 0.39 % exactly (a float32 mean stores 0.38999998…), and the report reads
    older records' float32 values as the counts they are, so a mean of 0.39 and 0.36 is the exact 0.375
    in every table (the float32 one, 0.37499998…, shows 0.37 in one and 0.38 in another)."""
    labels = torch.zeros(10_000, dtype=torch.uint8)
    preds = labels.clone()
    preds[:39] = 1
    assert error_pct(labels, preds) == 0.39
    old = {"test_error_pct": 0.38999998942017555, "n_test": 10_000, "affnist_error_pct": 6.109999865293503,
           "n_affnist": 10_000}
    read = uniform_metrics(old, "test", "affnist")
    assert (read["error_pct"], read["transformed_error_pct"]) == (0.39, 6.11)
    assert f"{(read['error_pct'] + uniform_metrics({'error_pct': 0.3599999938160181, 'n_test': 10_000}, 'test', 'x')['error_pct']) / 2:.2f}" == "0.38"
