"""Evaluation arithmetic on hand-made predictions."""

import math

import pytest
import torch

from pipeline.models.baseline import BaselineCNN
from pipeline.report.runs import uniform_metrics
from pipeline.training.evaluate import accuracy_by_bins, confusion_matrix, error_pct, evaluate_split
from pipeline.training.experiment import predict, to_float

RANGES = {"max_rotation_deg": 20.0, "max_shear": 0.2, "min_scale": 0.8, "max_scale": 1.2}


def test_accuracy_by_bins_on_a_hand_computed_example():
    # rotations −15°, −5°, −5°, 5°, 15°, 19.9° with correct = 1, 0, 1, 1, 0, 0; 4 bins of 10° over [−20, 20]
    params = torch.zeros(6, 6)
    params[:, 0] = torch.tensor([-15.0, -5.0, -5.0, 5.0, 15.0, 19.9])
    params[:, 1] = torch.tensor([-0.19, -0.19, -0.05, 0.05, 0.19, 0.19])
    params[:, 2] = 0.95
    params[:, 3] = torch.tensor([0.85, 0.85, 0.85, 1.15, 1.15, 1.15])  # scale_y: its own column and span
    correct = torch.tensor([True, False, True, True, False, False])
    bins = accuracy_by_bins(correct, params, RANGES, n_bins=4)
    rot = bins["rotation_deg"]
    assert rot["edges"] == [-20.0, -10.0, 0.0, 10.0, 20.0]
    assert rot["count"] == [1, 2, 1, 2]
    assert rot["accuracy_pct"] == pytest.approx([100.0, 50.0, 100.0, 0.0])
    assert bins["shear"]["count"] == [2, 1, 1, 2]
    assert bins["shear"]["accuracy_pct"] == pytest.approx([50.0, 100.0, 100.0, 0.0])
    assert bins["scale_x"]["count"] == [0, 6, 0, 0] and bins["scale_x"]["accuracy_pct"][0] is None
    assert bins["scale_y"]["edges"] == [0.8, 0.9, 1.0, 1.1, 1.2] and bins["scale_y"]["count"] == [3, 0, 0, 3]


def test_a_value_on_a_bins_edge_counts_in_the_bin_below_and_the_edges_keep_six_decimals():
    """Bins are (lower, upper]: a rotation of exactly −10° or 0° counts in the bin it closes, the span's
    lower end in the first. Eight bins of a ±0.2 shear span have edges 0.05 apart, kept to 6 decimals."""
    params = torch.zeros(4, 6)
    params[:, 0] = torch.tensor([-20.0, -10.0, 0.0, 10.0])
    params[:, 1] = 0.0
    params[:, 2:4] = 1.0
    bins = accuracy_by_bins(torch.tensor([True, True, False, True]), params, RANGES, n_bins=4)
    assert bins["rotation_deg"]["count"] == [2, 1, 1, 0]
    assert bins["rotation_deg"]["accuracy_pct"] == [100.0, 0.0, 100.0, None]
    shear = accuracy_by_bins(torch.tensor([True]), torch.zeros(1, 6), RANGES)["shear"]["edges"]
    assert shear == [-0.2, -0.15, -0.1, -0.05, 0.0, 0.05, 0.1, 0.15, 0.2]


def test_confusion_matrix_rows_are_true_classes():
    cm = confusion_matrix(torch.tensor([0, 0, 1, 2]), torch.tensor([0, 1, 1, 1]), 3)
    assert cm.tolist() == [[1, 1, 0], [0, 1, 0], [0, 1, 0]]


class Answers(torch.nn.Module):
    """A stand-in classifier that answers the class written in each image's first pixel (value 10·k)."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.num_classes = num_classes
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # where `predict` finds the device

    def forward(self, x):
        return torch.nn.functional.one_hot((x[:, 0, 0, 0] * 25.5).round().long(), self.num_classes).float()


def test_per_class_accuracy_is_each_true_class_s_share_predicted_right():
    """True classes 0, 0, 1, 2 answered 0, 1, 1, 1: class 0 half right, class 1 right, class 2 wrong
    (over the predicted counts it would read 1, 1/3, 0)."""
    labels, answers = torch.tensor([0, 0, 1, 2], dtype=torch.uint8), torch.tensor([0, 1, 1, 1])
    images = torch.zeros(4, 28, 28, dtype=torch.uint8)
    images[:, 0, 0] = (10 * answers).to(torch.uint8)
    metrics, arrays = evaluate_split(Answers(3), images, labels, batch_size=3, num_classes=3)
    assert metrics["per_class_accuracy"] == {"0": 0.5, "1": 1.0, "2": 0.0}
    assert metrics["error_pct"] == 50.0 and arrays["preds"].tolist() == answers.tolist() and metrics["n"] == 4


def test_a_split_s_compact_predictions_are_bytes_and_half_scores_and_an_absent_class_reads_zero():
    """evaluate_split's arrays are what predictions.safetensors keeps per image: labels and predictions
    as uint8, scores as float16. Per-class accuracy is rounded to 6 decimals (1/3 → 0.333333) and a
    class with no digit in the set reads 0, not NaN (which JSON cannot hold); an empty set's error is NaN."""
    labels, answers = torch.tensor([0, 0, 0, 1]), torch.tensor([0, 1, 1, 1])  # int64 labels: stored as bytes too
    images = torch.zeros(4, 28, 28, dtype=torch.uint8)
    images[:, 0, 0] = (10 * answers).to(torch.uint8)
    metrics, arrays = evaluate_split(Answers(3), images, labels, batch_size=4, num_classes=3)
    assert metrics["per_class_accuracy"] == {"0": 0.333333, "1": 1.0, "2": 0.0}
    assert (arrays["labels"].dtype, arrays["preds"].dtype, arrays["scores"].dtype) == (
        torch.uint8, torch.uint8, torch.float16)
    assert arrays["scores"].shape == (4, 3) and arrays["labels"].tolist() == labels.tolist()
    empty = torch.zeros(0, dtype=torch.uint8)
    assert math.isnan(error_pct(empty, empty))


def test_to_float_maps_the_byte_range_onto_0_to_1_exactly_with_a_channel():
    images = torch.tensor([[[0, 51], [255, 102]]], dtype=torch.uint8)  # (1, 2, 2)
    x = to_float(images)
    assert x.shape == (1, 1, 2, 2) and x.dtype == torch.float32
    assert torch.equal(x.flatten(), torch.tensor([0.0, 0.2, 1.0, 0.4])) and x.max() == 1.0  # k / 255, rounded once


def test_predictions_are_made_with_dropout_off_and_leave_the_model_training():
    """The baseline's dropout is off while it predicts (the same scores every time, those of eval mode),
    and a model that was training is training again afterwards."""
    torch.manual_seed(0)
    model = BaselineCNN(num_classes=3).train()
    images = torch.randint(0, 256, (4, 28, 28), dtype=torch.uint8)
    scores, _ = predict(model, images, batch_size=2)
    assert model.training
    again, _ = predict(model, images, batch_size=4)
    with torch.no_grad():
        expected = model.eval()(to_float(images))
    torch.testing.assert_close(scores, again)
    torch.testing.assert_close(scores, expected)


def test_a_model_in_eval_mode_predicts_and_stays_in_eval_mode():
    """predict puts back the mode it found: an evaluated model is not switched to training (dropout on)."""
    model = BaselineCNN(num_classes=3).eval()
    predict(model, torch.zeros(2, 28, 28, dtype=torch.uint8), batch_size=2)
    assert not model.training


def test_predictions_under_amp_are_bf16_arithmetic_returned_as_fp32_scores():
    """amp=True runs the model under bf16 autocast (its scores differ from fp32's, within bf16's
    precision) and the scores come back as float32 whatever the model computed in."""
    torch.manual_seed(0)
    model = BaselineCNN(num_classes=3).eval()
    images = torch.randint(0, 256, (4, 28, 28), dtype=torch.uint8)
    exact, _ = predict(model, images, batch_size=4)
    mixed, preds = predict(model, images, batch_size=4, amp=True)
    assert mixed.dtype == torch.float32 and not torch.equal(mixed, exact)
    torch.testing.assert_close(mixed, exact, rtol=0.05, atol=0.05)
    assert torch.equal(preds, mixed.argmax(dim=1))


def test_predictions_under_amp_are_bf16_not_fp16():
    """A linear classifier under amp gives what its layer computes in bf16, bit for bit (fp16 keeps three
    more mantissa bits and answers otherwise)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 3))
    images = torch.randint(0, 256, (4, 28, 28), dtype=torch.uint8)
    mixed, _ = predict(model, images, batch_size=4, amp=True)
    linear = model[1]
    with torch.no_grad():
        bf16 = torch.nn.functional.linear(to_float(images).flatten(1).bfloat16(), linear.weight.bfloat16(),
                                          linear.bias.bfloat16()).float()
    assert torch.equal(mixed, bf16)


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


def test_fig4_perturbs_each_dimension_of_the_winning_capsule_by_the_papers_steps():
    """PAPER.md, Fig. 4: each of the 16 dimensions of the winning DigitCaps vector, in steps of 0.05
    over [−0.25, 0.25], decoded. A stub whose decoder returns the masked pose itself shows which
    dimension of which capsule moved by how much."""
    from types import SimpleNamespace

    from pipeline.training.evaluate import fig4_grid

    class Stub(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.unused = torch.nn.Parameter(torch.zeros(1))

        def forward(self, images):  # capsule 3 wins, its pose all ones (in eval mode); the others are silent
            poses = torch.zeros(len(images), 10, 16)
            poses[:, 3] = 1.0 if not self.training else 2.0
            return SimpleNamespace(lengths=poses.norm(dim=-1), poses=poses)

        def decoder(self, poses, target):  # (B, K, D) -> (B, 1, 1, D): the target's pose as one image row
            return poses[torch.arange(len(poses)), target].view(-1, 1, 1, 16)

    grid = fig4_grid(Stub().train(), torch.zeros(28, 28, dtype=torch.uint8))  # evaluated, whatever the mode
    steps = [round(-0.25 + 0.05 * k, 2) for k in range(11)]
    expected = torch.ones(16, 11, 1, 16)
    for dim in range(16):
        expected[dim, :, 0, dim] += torch.tensor(steps)
    assert grid.shape == (16, 11, 1, 16) and torch.allclose(grid, expected)


def test_reconstructions_are_decoded_in_eval_mode_from_float_images():
    """`reconstructions` runs the model in eval mode on the images as floats in [0, 1] and returns its
    decoder's images without their channel."""
    from types import SimpleNamespace

    from pipeline.training.evaluate import reconstructions

    class Stub(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.unused = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):  # (B, 1, H, W): its input back, doubled while training
            return SimpleNamespace(reconstructions=x * (2 if self.training else 1))

    images = torch.tensor([[[0, 255], [51, 0]]], dtype=torch.uint8)
    out = reconstructions(Stub().train(), images)
    assert out.shape == (1, 2, 2) and torch.equal(out, to_float(images)[:, 0])


def saved_model(folder, **record):
    """A train stage's output in ``folder``: capsnet_r1's initial weights and a config.json with its
    RunConfig and ``record`` (run_id, params, epochs_trained, stop_reason); returns (config, model)."""
    import dataclasses
    import json

    from safetensors.torch import save_file

    from conftest import committed_params
    from pipeline.training.config import run_config
    from pipeline.training.train import build_model

    cfg = dataclasses.replace(run_config(committed_params(), "capsnet_r1", 0), device="cpu")
    model = build_model(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: t.contiguous() for k, t in model.state_dict().items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"config": dataclasses.asdict(cfg), **record}))
    return cfg, model


def test_the_evaluate_stage_loads_the_trained_weights_in_eval_mode(tmp_path):
    """load_model: the config and weights train wrote, the model in eval mode (the CNNs' dropout off,
    so an evaluation is one deterministic pass)."""
    from pipeline.stages.evaluate import load_model

    cfg, model = saved_model(tmp_path)
    saved, loaded_cfg, loaded = load_model(tmp_path)
    assert loaded_cfg == cfg and not loaded.training
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))


def test_an_evaluation_scores_each_set_under_its_own_keys_and_writes_what_the_report_reads(tmp_path, monkeypatch):
    """`evaluate_sets` with the `Answers` stand-in on a clean set (12 digits, 3 wrong) and a transformed
    one (5 digits, 3 wrong, with transforms, ranges and source digits): each set's error and count
    under its own keys, per-class accuracy, source and transform bins by set name (bins from the right
    answers), the per-image predictions, one confusion panel per set, and for a reconstruction variant
    the first 10 clean digits reconstructed and the first one perturbed (Fig. 4) at the paper's steps."""
    import json
    from types import SimpleNamespace

    from safetensors.torch import load_file

    from pipeline.data.splits import save_split
    from pipeline.experiments import base, table1

    def write(name, labels, answers, meta, **extra):
        images = torch.zeros(len(labels), 28, 28, dtype=torch.uint8)
        images[:, 0, 0] = (10 * torch.tensor(answers)).to(torch.uint8)
        save_split(tmp_path / f"{name}.safetensors", images, torch.tensor(labels, dtype=torch.uint8), meta, **extra)
        return images

    labels = [0, 1, 2] * 4
    clean = write("test", labels, [*labels[:3], 1, 2, 0, *labels[6:]], {"source": "MNIST test set"})
    params = torch.zeros(5, 6)
    params[:, 0] = torch.tensor([-15.0, -5.0, 5.0, 15.0, 15.0])
    params[:, 2:4] = 1.0
    digits = torch.tensor([7, 3, 3, 0, 9], dtype=torch.int64)
    write("affine_test", [0, 0, 1, 1, 2], [0, 1, 1, 0, 0], {"source": "affine", "ranges": json.dumps(RANGES)},
          affine_params=params, digit_index=digits)
    drawn = []
    monkeypatch.setattr(base.figures, "confusion",
                        lambda panels, title, path: drawn.append(("confusion", panels, title)))
    monkeypatch.setattr(base.figures, "image_grid", lambda rows, labels, title, path, col_labels=None:
                        drawn.append((path.name, rows, col_labels)))
    monkeypatch.setattr(base, "reconstructions", lambda model, images: images + 1)
    monkeypatch.setattr(base, "fig4_grid", lambda model, image: image.expand(16, 11, 28, 28))
    cfg = SimpleNamespace(variant="v", seed=3, eval_batch_size=2, num_classes=3, reconstruction=True)
    out = tmp_path / "out"
    out.mkdir()
    ev = base.evaluate_sets(("test", "affine_test"), Answers(3), cfg, tmp_path, out)

    assert ev.metrics == {"error_pct": 25.0, "n_test": 12, "transformed_error_pct": 60.0, "n_transformed": 5}
    assert ev.logged == {"eval_test_error_pct": 25.0, "eval_affine_test_error_pct": 60.0}
    assert ev.artifacts == ["breakdown.json"]
    assert [(d["name"], d["context"]) for d in ev.datasets] == [("test", "evaluation"), ("affine_test", "evaluation")]
    breakdown = json.loads((out / "breakdown.json").read_text())
    assert breakdown["per_class"] == {"test": {"0": 0.75, "1": 0.75, "2": 0.75},
                                      "affine_test": {"0": 0.5, "1": 0.5, "2": 0.0}}
    assert breakdown["sources"] == {"test": "MNIST test set", "affine_test": "affine"}
    right = torch.tensor([True, False, True, False, False])
    assert breakdown["bins"] == {"affine_test": json.loads(json.dumps(accuracy_by_bins(right, params, RANGES)))}
    saved = load_file(str(out / "predictions.safetensors"))
    assert saved["affine_test_preds"].tolist() == [0, 1, 1, 0, 0] and saved["test_labels"].tolist() == labels
    assert saved["affine_test_digit_index"].tolist() == digits.tolist() and "test_digit_index" not in saved

    (_, panels, title), (recon, rows, _), (fig4, grid, steps) = drawn
    assert [name for _, name in panels] == ["test", "affine_test"] and title == "v seed 3"
    assert recon == "reconstructions.png" and torch.equal(rows[0], clean[:10]) and torch.equal(rows[1], clean[:10] + 1)
    assert fig4 == "fig4.png" and len(grid) == 16 and all(torch.equal(g, clean[0].expand(11, 28, 28)) for g in grid)
    assert steps == [f"{s:+.2f}".replace("-0.00", "+0.00") for s in torch.linspace(-0.25, 0.25, 11).tolist()]
    assert steps[0] == "-0.25" and steps[5] == "+0.00"
    assert table1.evaluate(Answers(3), cfg, tmp_path, out).metrics == ev.metrics  # Table 1's sets, clean first


def test_the_evaluate_stage_adds_the_runs_record_clears_an_earlier_evaluations_figures_and_logs_every_file(
        tmp_path, monkeypatch):
    """Stage `evaluate` around its experiment's evaluation: metrics.json holds the set metrics and the train
    stage's record (parameters, epochs, whether early stopping's target was reached: the report's columns
    read them there), figures/ only this evaluation's (an earlier one's gone), and the training run gets
    the logged metrics at the epoch it ended, the test sets, metrics.json, the experiment's files and
    every figure."""
    import json

    from pipeline.experiments import base, table1
    from pipeline.stages import evaluate as evaluate_stage

    model_dir, out = tmp_path / "models" / "capsnet_r1" / "seed0", tmp_path / "results"
    saved_model(model_dir, run_id="r7", params={"n_params": 1234}, epochs_trained=7, stop_reason="target")
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "fig4.png").write_bytes(b"an earlier evaluation's")

    def evaluation(model, cfg, data_dir, out_dir):
        (out_dir / "figures" / "confusion.png").write_bytes(b"this one's")
        (out_dir / "breakdown.json").write_text("{}")
        return base.Evaluation({"error_pct": 1.5, "n_test": 10}, {"eval_test_error_pct": 1.5}, ["breakdown.json"],
                               [{"name": "test"}])

    class Tracker:
        calls = []

        def has_run(self, run_id):
            return run_id == "r7"

        def log_metrics_once(self, run_id, metrics, step):
            self.calls.append(("metrics", run_id, metrics, step))

        def log_datasets(self, run_id, datasets):
            self.calls.append(("datasets", run_id, datasets))

        def log_artifact(self, run_id, path, folder):
            self.calls.append(("artifact", run_id, path.relative_to(out).as_posix(), folder))

    monkeypatch.setattr(table1, "evaluate", evaluation)
    monkeypatch.setattr(evaluate_stage.tracking, "open_tracker", lambda profile: Tracker())
    metrics = evaluate_stage.run(model_dir, tmp_path / "data", out)
    assert metrics == {"error_pct": 1.5, "n_test": 10, "n_params": 1234, "epochs_trained": 7, "reached_target": True}
    assert json.loads((out / "metrics.json").read_text()) == metrics
    assert [p.name for p in (out / "figures").iterdir()] == ["confusion.png"]
    assert Tracker.calls == [("metrics", "r7", {"eval_test_error_pct": 1.5}, 7), ("datasets", "r7", [{"name": "test"}]),
                             *[("artifact", "r7", name, "evaluation")
                               for name in ("metrics.json", "breakdown.json", "figures/confusion.png")]]
