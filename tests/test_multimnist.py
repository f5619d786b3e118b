"""MultiMNIST (§6): recipes, composition, the two-digit losses, the pair rule, models, training, report."""

import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file
from scipy import stats as sp

from report_runs import REFERENCE, draw, fabricate
from pipeline.experiments import multimnist as mm
from pipeline.models.baseline import MultiMNISTCNN
from pipeline.models.capsnet import CapsNet, capsnet_loss, margin_loss, reconstruction_loss
from pipeline.training.config import RunConfig
from pipeline.training.train import train

LABELS = torch.arange(60) % 10  # (60,) six digits per class


def test_pairs_are_two_classes_and_shifts_cover_the_range():
    pairs, shifts = mm.sample_pairs(mm.class_index(LABELS), 5000, 4, torch.Generator().manual_seed(0))
    assert pairs.shape == (5000, 2) and shifts.shape == (5000, 2, 2)
    assert bool((LABELS[pairs[:, 0]] != LABELS[pairs[:, 1]]).all())
    assert shifts.min() == -4 and shifts.max() == 4 and set(shifts.flatten().tolist()) == set(range(-4, 5))
    assert len(set(pairs[:, 1].tolist())) == 60  # every digit can be the partner
    assert len(set(pairs[:, 0].tolist())) == 60  # and the first digit
    same = (shifts[:, 0] == shifts[:, 1]).all(dim=1).float().mean()  # each digit its own shift: 1 in 81 alike
    assert 0 < same < 0.03


def test_a_partner_drawn_at_the_top_of_the_unit_interval_is_still_a_digit_of_another_class(monkeypatch):
    """The partner is a uniform position among the other classes' digits, ``rand · others``, held below
    ``others`` by a guard. torch.rand stays below 1.0 on the CPU and on CUDA (which maps curand's 1.0 to 0),
    and the float32 product rounds below ``others``: the guard is for a generator that would not, so this
    test draws exactly 1.0 to reach it."""
    monkeypatch.setattr(torch, "rand", lambda n, **kw: torch.ones(n, device=kw.get("device")))
    pairs, _ = mm.sample_pairs(mm.class_index(LABELS), 30, 4, torch.Generator().manual_seed(0))
    last_other = [max(i for i in range(60) if LABELS[i] != LABELS[a]) for a in pairs[:, 0].tolist()]
    assert pairs[:, 1].tolist() == last_other  # the last digit of the other classes in class order


def test_test_recipes_are_deterministic_round_by_round_and_compact():
    r = mm.test_recipes(LABELS, 3, 6, seed=7)
    assert r["pairs"].dtype == torch.int32 and r["shifts"].dtype == torch.int8 and r["pairs"].shape == (180, 2)
    assert r["pairs"][:, 0].tolist() == list(range(60)) * 3  # any prefix of N recipes covers every digit
    assert bool((LABELS[r["pairs"][:, 0].long()] != LABELS[r["pairs"][:, 1].long()]).all())
    assert int(r["shifts"].abs().max()) == 6  # the official README's --shift=6 is runnable
    again, other = mm.test_recipes(LABELS, 3, 6, seed=7), mm.test_recipes(LABELS, 3, 6, seed=8)
    assert all(torch.equal(r[k], again[k]) for k in r)
    assert not torch.equal(r["pairs"], other["pairs"])


def test_place_pads_by_four_and_shifts_with_zero_fill():
    digit = torch.zeros(1, 28, 28, dtype=torch.uint8)
    digit[0, 0, 0], digit[0, 27, 27] = 7, 9
    for dy, dx in [(0, 0), (3, -2), (-4, 4)]:
        canvas = mm.place(digit, torch.tensor([[dy, dx]]))[0]  # (36, 36)
        assert canvas.shape == (36, 36) and canvas[4 + dy, 4 + dx] == 7 and canvas[31 + dy, 31 + dx] == 9
        assert int(canvas.sum()) == 16
    assert int(mm.place(digit, torch.tensor([[-6, 0]]))[0].sum()) == 9  # ink pushed past the border is lost


def test_compose_merges_as_saturating_sum():
    images = torch.zeros(2, 28, 28, dtype=torch.uint8)
    images[0, 10, 10], images[1, 10, 10], images[1, 11, 11] = 200, 100, 50
    merged, digits = mm.compose(images, torch.tensor([[0, 1]]), torch.zeros(1, 2, 2, dtype=torch.int8))
    assert merged.dtype == torch.uint8 and merged[0, 14, 14] == 255 and merged[0, 15, 15] == 50  # min(200 + 100, 255)
    assert digits[0, 0, 14, 14] == 200 and digits[0, 1, 14, 14] == 100  # each digit alone: the targets


def test_compose_shifts_each_digit_by_its_own_shift():
    images = torch.randint(0, 256, (2, 28, 28), dtype=torch.uint8)
    shifts = torch.tensor([[[3, -2], [-4, 1]]])  # (1, 2, 2): digit a, digit b
    _, digits = mm.compose(images, torch.tensor([[0, 1]]), shifts)
    assert torch.equal(digits[0, 0], mm.place(images[:1], shifts[:, 0])[0])
    assert torch.equal(digits[0, 1], mm.place(images[1:], shifts[:, 1])[0])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_composing_on_the_device_equals_the_cpu():
    images = torch.randint(0, 256, (60, 28, 28), dtype=torch.uint8)
    r = mm.test_recipes(LABELS, 2, 4, seed=1)
    cpu = mm.compose(images, r["pairs"], r["shifts"])
    gpu = mm.compose(images.cuda(), r["pairs"].cuda(), r["shifts"].cuda())
    assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu, gpu))


class Scorer(torch.nn.Module):
    """A fixed linear map from a 36×36 image to 10 class scores that remembers, per call, whether it
    was in training mode and the largest pixel it saw; given labels, it "reconstructs" the image
    itself for both digits."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(36 * 36, 10)
        self.calls = []

    def forward(self, x, labels=None):
        self.calls.append((self.training, float(x.max())))
        if labels is not None:
            return SimpleNamespace(reconstructions=torch.stack([x, x], dim=1))  # (k, 2, 1, 36, 36)
        return self.linear(x.flatten(1))


def recipes_over(n: int = 10):
    """``n`` random uint8 digits of labels that are not their indices, and 2 · n test recipes over them."""
    images = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    labels = (torch.arange(n) * 3) % 10
    return images, labels, mm.test_recipes(labels, 2, 3, seed=1)


def test_predicted_pairs_compose_each_batch_from_its_own_recipes_in_eval_mode_and_give_the_mode_back():
    torch.manual_seed(0)
    model, (images, _, r) = Scorer().train(), recipes_over()
    got = mm.predict_pairs(model, images, r["pairs"], r["shifts"], batch_size=7)  # batches of 7, 7, 6
    merged, _ = mm.compose(images, r["pairs"], r["shifts"])
    with torch.no_grad():
        assert torch.equal(got, mm.top2(model.linear(mm.to_float(merged).flatten(1))))
    assert [training for training, _ in model.calls] == [False] * 3 and model.training
    assert max(seen for _, seen in model.calls) <= 1.0  # images in [0, 1]


def test_predicted_pairs_run_under_bf16_autocast_only_when_asked():
    seen = []

    class Autocast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(36 * 36, 10)

        def forward(self, x):
            seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
            return self.linear(x.flatten(1))

    images, _, r = recipes_over()
    for amp in (True, False):
        mm.predict_pairs(Autocast(), images, r["pairs"], r["shifts"], batch_size=20, amp=amp)
    assert seen[0] == (True, torch.bfloat16) and not seen[1][0]


def test_the_multimnist_curve_is_the_pair_error_in_percent_of_its_recipes_true_classes(monkeypatch):
    """`Training.test_error`: the share of the curve's recipes (the first CURVE_RECIPES, here 16 of 20)
    whose predicted pair is not the pair of their digits' classes (labels that differ from the digits'
    indices), in percent."""
    images, labels, r = recipes_over()
    data = {"train_images": images, "train_labels": labels, "test_images": images, "test_labels": labels,
            "test_pairs": r["pairs"], "test_shifts": r["shifts"]}
    cfg = SimpleNamespace(batch_size=4, max_shift=3, multimnist_epoch_size=8)
    monkeypatch.setattr(mm, "CURVE_RECIPES", 16)
    exp = mm.Training(cfg, data, torch.device("cpu"))
    truth = labels[r["pairs"][:16].long()].sort(dim=1).values  # (16, 2)
    predicted = truth.clone()
    predicted[:5, 1] = (predicted[:5, 0] + 5) % 10  # 5 of 16 pairs with one digit wrong, at most
    wrong = int((~mm.pair_correct(predicted, truth)).sum())
    assert 0 < wrong <= 5
    given = {}

    def predict_pairs(model, images, pairs, shifts, batch_size, amp):
        given.update(images=images, pairs=pairs, shifts=shifts, batch_size=batch_size)
        return predicted

    monkeypatch.setattr(mm, "predict_pairs", predict_pairs)
    assert exp.test_error(None, 16, False) == 100.0 * wrong / 16
    assert torch.equal(given["pairs"], r["pairs"][:16].long()) and torch.equal(given["shifts"], r["shifts"][:16])
    assert given["batch_size"] == 16 and exp.steps_per_epoch == 2


def test_a_training_batch_is_a_fresh_pair_its_two_classes_and_each_digit_alone_in_0_1():
    """`Training.batch`: the merged canvas as the input, the classes of both digits as labels (never
    the first digit's twice: every pair is two classes), and each shifted digit alone as its
    reconstruction target, all in [0, 1]; drawn by `sample_pairs` from the step's generator."""
    images, labels, r = recipes_over()
    data = {"train_images": images, "train_labels": labels, "test_images": images, "test_labels": labels,
            "test_pairs": r["pairs"], "test_shifts": r["shifts"]}
    exp = mm.Training(SimpleNamespace(batch_size=6, max_shift=3, multimnist_epoch_size=12), data, torch.device("cpu"))
    got = exp.batch(exp.epoch_order(torch.Generator()), 0, torch.Generator().manual_seed(5))
    pairs, shifts = mm.sample_pairs(mm.class_index(labels), 6, 3, torch.Generator().manual_seed(5))
    merged, digits = mm.compose(images, pairs, shifts)
    assert torch.equal(got.x, merged.unsqueeze(1).float() / 255) and torch.equal(got.labels, labels[pairs])
    assert bool((got.labels[:, 0] != got.labels[:, 1]).all())
    assert got.targets.shape == (6, 2, 1, 36, 36) and torch.equal(got.targets, digits.unsqueeze(2).float() / 255)
    assert float(got.targets.max()) <= 1.0 < float(digits.max())


def test_the_two_predicted_capsules_reconstruct_from_the_image_in_0_1_in_eval_mode_and_give_the_mode_back():
    model, (images, _, r) = Scorer().train(), recipes_over()
    merged, _ = mm.compose(images, r["pairs"][:3], r["shifts"][:3])
    out = mm.reconstruct_pairs(model, merged, torch.tensor([[1, 2], [3, 4], [5, 6]]))
    assert out.shape == (3, 2, 36, 36) and torch.equal(out[:, 1], merged.float() / 255)
    assert model.calls == [(False, float(merged.max()) / 255)] and model.training


def test_margin_loss_with_two_positive_classes_by_hand():
    lengths = torch.tensor([[0.8, 0.95, 0.3]])  # classes 0 and 1 present, 2 absent
    # present: (0.9 − 0.8)² = 0.01 and max(0, 0.9 − 0.95)² = 0; absent: 0.5 · (0.3 − 0.1)² = 0.02
    assert float(margin_loss(lengths, torch.tensor([[0, 1]]))) == pytest.approx(0.03)
    assert float(margin_loss(lengths, torch.tensor([[1, 0]]))) == pytest.approx(0.03)  # order-free


def test_two_digit_reconstruction_loss_sums_both_digits_by_hand():
    recon = torch.zeros(1, 2, 1, 2, 2)
    target = torch.zeros(1, 2, 1, 2, 2)
    target[0, 0, 0, 0, 0], target[0, 1, 0, 1, 1] = 1.0, 0.5  # SSE_a = 1, SSE_b = 0.25
    assert float(reconstruction_loss(recon, target)) == pytest.approx(0.0005 * 1.25)


def test_decoder_reconstructs_each_digit_from_its_own_capsule():
    torch.manual_seed(0)
    model = CapsNet(routing_iterations=1, reconstruction=True, image_size=36).eval().requires_grad_(False)
    x, labels = torch.rand(2, 1, 36, 36), torch.tensor([[3, 7], [0, 9]])
    out = model(x, labels)
    assert out.reconstructions.shape == (2, 2, 1, 36, 36)
    for k in range(2):
        assert torch.allclose(out.reconstructions[:, k], model.decoder(out.poses, labels[:, k]))
    targets = torch.rand(2, 2, 1, 36, 36)
    total, margin, recon = capsnet_loss(out, x, labels, "paper", targets)
    assert float(recon) == pytest.approx(float(reconstruction_loss(out.reconstructions, targets)))
    assert float(total) == pytest.approx(float(margin + recon))


def test_pair_rule_is_order_free_and_one_right_digit_is_an_error():
    predicted = mm.top2(torch.tensor([[0.1, 0.9, 0.2, 0.8], [0.9, 0.1, 0.8, 0.2], [0.5, 0.6, 0.1, 0.0]]))
    assert predicted.tolist() == [[1, 3], [0, 2], [0, 1]]
    truth = torch.tensor([[3, 1], [0, 3], [2, 3]])
    assert mm.pair_correct(predicted, truth).tolist() == [True, False, False]
    cm = mm.digit_confusion(predicted, truth, num_classes=4)
    assert cm[1, 1] == cm[3, 3] == cm[0, 0] == 1 and cm[3, 2] == 1  # 3 missed, 2 predicted instead
    assert cm[2, 0] == 1 and cm[3, 1] == 1 and int(cm.sum()) == 6  # neither right: paired in sorted order


def test_the_digit_confusion_pairs_a_missed_class_with_the_prediction_left_over_and_counts_repeats():
    """A pair with one digit right puts the missed true class against the predicted class that is not
    true, whichever places they hold in the sorted pairs; the same confusion twice counts 2."""
    truth = torch.tensor([[1, 5], [1, 5], [2, 4]])
    predicted = torch.tensor([[0, 1], [0, 1], [2, 4]])  # 1 right, 5 taken for 0 (twice); all right
    cm = mm.digit_confusion(predicted, truth, num_classes=6)
    expected = torch.zeros(6, 6, dtype=torch.long)
    expected[1, 1], expected[5, 0], expected[2, 2], expected[4, 4] = 2, 2, 1, 1
    assert torch.equal(cm, expected)


def test_36_pixel_models_have_the_papers_parameter_counts():
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(CapsNet(3, True, 36)) == 11_361_808  # paper §6: 11.36M
    assert count(MultiMNISTCNN(36)) == 24_535_306  # paper §6: 24.56M
    valid = [torch.nn.Conv2d(1, 512, 5), torch.nn.Conv2d(512, 256, 5), torch.nn.Linear(6 * 6 * 256, 1024),
             torch.nn.Linear(1024, 10)]  # the code's default VALID padding: 36 → 32 → 16 → 12 → 6
    assert sum(count(m) for m in valid) == 12_738_826  # far from 24.56M, so the paper used SAME
    assert CapsNet(3, True, 36).config.num_primary == 3_200


@pytest.mark.parametrize("model, routing, recon", [("multimnist_cnn", 0, False), ("capsnet", 1, True)])
def test_multimnist_variants_train_on_cpu_with_finite_loss(tmp_path, model, routing, recon):
    from conftest import synthetic_digits

    images, labels = synthetic_digits(40, seed=1)
    test_images, test_labels = synthetic_digits(20, seed=2)
    r = mm.test_recipes(test_labels, 2, 4, seed=0)
    data = {"train_images": images, "train_labels": labels, "test_images": test_images, "test_labels": test_labels,
            "test_pairs": r["pairs"], "test_shifts": r["shifts"]}
    cfg = RunConfig(variant="m", model=model, routing_iterations=routing, reconstruction=recon, image_size=36,
                    num_classes=10, target_accuracy_pct=0.0, seed=0, profile="smoke", epochs=2, batch_size=8,
                    lr=1e-3, lr_decay_rate=0.96, lr_decay_steps=2000, lr_min=1e-6, max_shift=4, amp=False,
                    compile=False, deterministic=True, log_every=1, eval_batch_size=16, device="cpu",
                    multimnist_epoch_size=8)  # one step an epoch: the 24.5M-parameter CNN is not what is tested
    result = train(cfg, data, tmp_path / "ckpt.pt")
    assert result.steps == 2 and len(result.history) == 2
    assert all(torch.isfinite(torch.tensor(h["train_loss"])) for h in result.history)
    assert all((h["reconstruction_loss"] > 0) == recon for h in result.history)  # the CNN has no decoder
    assert 0 <= result.history[-1]["test_error_pct"] <= 100


def test_report_renders_the_multimnist_column_from_fabricated_runs(tmp_path):

    from pipeline.experiments import multimnist_report as rm
    from pipeline.experiments import table1_report as t1
    from pipeline.report import runs as rr

    for seed, err in enumerate([0.3, 0.4]):
        fabricate(tmp_path, "capsnet_r3_recon", seed, err)
    runs = rr.load_runs(tmp_path / "models", tmp_path / "results", ["capsnet_r3_recon"], [0, 1])
    multi = []
    for seed, err in enumerate([5.0, 5.4]):
        run = runs[0]
        multi.append(rr.Run("multimnist_r3_recon", seed, {"error_pct": err, "n_params": 11_361_808}, run.config,
                            run.history, {}, {}, {}))
    table = rm.multimnist_summary(multi, REFERENCE)
    row = table.set_index("variant").loc["multimnist_r3_recon"]
    assert row.error_mean == pytest.approx(5.2) and row.error_std == pytest.approx(0.2828, abs=1e-4)
    # no paper σ: the interval is ours alone, SE = 0.2828/√2 = 0.2 on 1 df, so ±12.71·0.2
    assert (row.delta_ci_low, row.delta_ci_high) == pytest.approx((-2.541, 2.541), abs=1e-3)
    assert row.verdict == "consistent" and row.table1_row == "capsnet_r3_recon"
    text = "\n".join(rm.render_both_columns(t1.summarize(runs, REFERENCE), table, REFERENCE))
    assert "| CapsNet | 3 | yes | 0.35 ± 0.07 | 0.25 | 5.20 ± 0.28 | 5.2 | consistent |" in text
    assert "| Baseline | – | – | not run | 0.39 | not run | 8.1 | – |" in text
    assert "| CapsNet | 1 | no | not run | 0.34 | – | – | – |" in text
    json.dumps(table.to_dict())  # the CSV/JSON outputs can hold it


def test_the_multimnist_column_reads_its_first_protocols_rows_and_names_it(tmp_path):
    """A MultiMNIST seed a later window trained under another protocol is a row of its own, listed
    after the protocol with more runs, whose row the both-columns table reads and names."""

    from pipeline.experiments import multimnist_report as rm
    from pipeline.experiments import table1_report as t1
    from pipeline.report import runs as rr

    fabricate(tmp_path / "cut", "capsnet_r3_recon", 0, 0.3)
    fabricate(tmp_path / "new", "capsnet_r3_recon", 0, 0.3, lr_schedule_epochs=640)
    cut, new = (rr.load_runs(tmp_path / f / "models", tmp_path / f / "results", ["capsnet_r3_recon"], [0])[0]
                for f in ("cut", "new"))
    multi = [rr.Run("multimnist_r3_recon", 0, {"error_pct": 9.0, "n_params": 1}, new.config, new.history, {}, {}, {})]
    multi += [rr.Run("multimnist_r3_recon", seed, {"error_pct": err, "n_params": 1}, cut.config, cut.history, {}, {}, {})
              for seed, err in ((1, 5.0), (2, 5.4))]
    table = rm.multimnist_summary(multi, REFERENCE)
    assert list(table.n_seeds) == [2, 1] and list(table.protocol) == [cut.protocol, new.protocol]
    text = "\n".join(rm.render_both_columns(t1.summarize([cut], REFERENCE), table, REFERENCE))
    assert "| CapsNet | 3 | yes | 0.30 | 0.25 | 5.20 ± 0.28 | 5.2 | consistent |" in text
    assert f"from the first rows of the table below ({cut.protocol})" in text


def _multimnist_runs(tmp_path, errors: dict) -> list:
    """MultiMNIST runs of one fingerprinted Table 1 run's record: {variant: [pair error % per seed]}."""

    from pipeline.report import runs as rr

    fabricate(tmp_path, "capsnet_r3_recon", 0, 0.3, fingerprint="1234abcd5678ef90")
    run = rr.load_runs(tmp_path / "models", tmp_path / "results", ["capsnet_r3_recon"], [0])[0]
    return [rr.Run(variant, seed, {"error_pct": err, "n_params": 11_361_808}, run.config, run.history, {}, {}, {},
                   commit=run.commit) for variant, seeds in errors.items() for seed, err in enumerate(seeds)]


def test_the_multimnist_tables_name_each_rows_seeds_origin_and_parameters(tmp_path):
    """The both-columns table reads the headline protocol's first MNIST row of a variant (a variant only
    another protocol ran is not run there); one seed has no ± and no verdict; the detail table gives each
    row's fingerprint and commit, per-seed errors, Δ against the paper and both parameter counts, and
    dashes for a variant the paper has no number for."""

    from pipeline.experiments import multimnist_report as rm

    errors = {"multimnist_r3_recon": [5.0, 5.6], "multimnist_r1_recon": [7.0], "multimnist_r3": [6.0, 6.2]}
    multi = rm.multimnist_summary(_multimnist_runs(tmp_path, errors), REFERENCE)
    assert list(multi.verdict) == ["consistent", "one seed: no verdict", "no paper value"]
    table1 = pd.DataFrame({"protocol": ["p", "p", "q"],  # r3 + recon at two commits under p, the baseline under q
                           "variant": ["capsnet_r3_recon", "capsnet_r3_recon", "baseline_cnn"],
                           "test_error_mean": [0.35, 0.9, 0.5], "test_error_std": [0.07, math.nan, math.nan]})
    lines = rm.render_both_columns(table1, multi, REFERENCE)
    text = "\n".join(lines)
    assert "MNIST from the paper-recipe rows of the first Table 1 above (p);" in text
    assert "| CapsNet | 3 | yes | 0.35 ± 0.07 | 0.25 | 5.30 ± 0.42 | 5.2 | consistent |" in lines
    assert "| CapsNet | 1 | yes | not run | 0.29 | 7.00 | 7.5 | one seed: no verdict |" in lines
    assert "| Baseline | – | – | not run | 0.39 | not run | 8.1 | – |" in lines  # baseline_cnn ran under q alone
    protocol = multi.protocol[0]
    half = sp.t.ppf(0.975, 1) * 0.6 / math.sqrt(2) / math.sqrt(2)  # t(1)·s/√n, s = 0.6/√2
    assert (f"| multimnist_r3_recon | {protocol} | fp 1234abcd: c0ffee0 | 2 | 5.00 5.60 | 5.2 | +0.10 | "
            f"[{0.1 - half:+.2f}, {0.1 + half:+.2f}] | 11,361,808 / 11.36M |") in lines
    no_paper = f"| multimnist_r3 | {protocol} | fp 1234abcd: c0ffee0 | 2 | 6.00 6.20 | – | – | – | 11,361,808 / – |"
    assert no_paper in lines
    assert "500 partners per test digit, 50,000 pairs" in rm.test_size_deviation(500, test_subset=100)[0]


def test_the_multimnist_figure_is_the_best_seed_of_the_lowest_error_reconstruction_variant(tmp_path):

    from pipeline.experiments import multimnist_report as rm

    runs = _multimnist_runs(tmp_path, {"multimnist_r1_recon": [4.9, 9.0], "multimnist_r3_recon": [5.6, 5.0]})
    for r in runs:
        draw(tmp_path, r.variant, r.seed, "reconstructions.png")
    (tmp_path / "figures").mkdir()
    shown = rm.figure(runs, rm.multimnist_summary(runs, REFERENCE), tmp_path / "results", tmp_path / "figures")
    assert (tmp_path / "figures" / "multimnist_reconstructions.png").read_bytes() == b"multimnist_r3_recon seed 1"
    assert list(shown) == ["MultiMNIST reconstructions (multimnist_r3_recon, seed 1; red and green: the two predicted "
                           "capsules)"]
    baseline = [r for r in runs if r.variant == "multimnist_r1_recon"]
    for r in baseline:
        r.config["config"]["reconstruction"] = False
    assert rm.figure(baseline, None, tmp_path / "results", tmp_path / "figures") == {}
    assert (tmp_path / "figures" / "multimnist_reconstructions.png").read_bytes().startswith(b"\x89PNG")  # placeholder


def test_an_evaluation_scores_pairs_whole_and_writes_what_the_report_reads(tmp_path, monkeypatch):
    """With the model's pairs given (`predict_pairs` stubbed): 7 of 10 pairs right, one with one digit
    right, two with none: 30 % pair error, 80 % with at least one right; predictions hold the true pairs
    sorted and the predicted ones; the confusion names the seed; a reconstruction variant draws five right
    pairs and one failure, marked; the error is logged and breakdown.json kept. A split without recipes
    is refused."""
    from types import SimpleNamespace

    from pipeline.core.errors import UserError
    from pipeline.data.splits import save_split, split_metadata

    images, labels = torch.zeros(10, 28, 28, dtype=torch.uint8), torch.arange(10, dtype=torch.uint8)
    recipes = mm.prepare_multimnist(tmp_path, images, labels, pairs_per_digit=1, max_shift=2, seed=0)
    meta = split_metadata(tmp_path / "multimnist_test.safetensors")  # training reads the shift back (`configure`)
    assert (meta["max_shift"], meta["pairs_per_digit"]) == ("2", "1")
    truth = labels.long()[recipes["pairs"].long()]  # (10, 2) in recipe order
    assert bool((truth[:, 0] > truth[:, 1]).any())  # some pair's first digit is the larger: sorting matters
    truth = truth.sort(dim=1).values
    absent = [[c for c in range(10) if c not in pair] for pair in truth.tolist()]  # classes not in each pair
    predicted = truth.clone()
    predicted[7] = torch.tensor(sorted([absent[7][0], int(truth[7, 1])]))  # one digit right
    predicted[8:] = torch.tensor([classes[:2] for classes in absent[8:]])  # none right
    monkeypatch.setattr(mm, "predict_pairs", lambda *args: predicted)
    monkeypatch.setattr(mm, "reconstruct_pairs", lambda model, merged, pairs: torch.zeros(len(merged), 2, 36, 36))
    drawn = {}
    monkeypatch.setattr(mm.figures, "confusion", lambda panels, title, path: drawn.update(confusion=title, cm=panels[0][0]))
    monkeypatch.setattr(mm.figures, "multimnist_reconstructions",
                        lambda merged, recons, titles, title, path: drawn.update(titles=titles))
    cfg = SimpleNamespace(variant="multimnist_r3_recon", seed=4, num_classes=10, eval_batch_size=4, reconstruction=True)
    (tmp_path / "out").mkdir()
    result = mm.evaluate(None, cfg, tmp_path, tmp_path / "out")
    assert result.metrics == {"error_pct": 30.0, "n_test": 10}
    assert result.logged == {"eval_multimnist_test_error_pct": 30.0} and result.artifacts == ["breakdown.json"]
    breakdown = json.loads((tmp_path / "out" / "breakdown.json").read_text())
    assert breakdown["at_least_one_right_pct"] == pytest.approx(80.0)
    source = "MultiMNIST recipes: 1 partners per test digit, shifts ≤ 2 px, seed 0"
    assert breakdown["sources"] == {"multimnist_test": source}
    saved = load_file(str(tmp_path / "out" / "predictions.safetensors"))
    assert torch.equal(saved["multimnist_test_labels"].long(), truth)
    assert torch.equal(saved["multimnist_test_preds"].long(), predicted)
    assert drawn["confusion"] == "multimnist_r3_recon seed 4"
    assert drawn["cm"] == mm.digit_confusion(predicted, truth).tolist() != mm.digit_confusion(truth, predicted).tolist()
    assert len(drawn["titles"]) == 6 and drawn["titles"][-1].startswith("FAIL true")
    assert not any(t.startswith("FAIL") for t in drawn["titles"][:5])
    save_split(tmp_path / "multimnist_test.safetensors", images, labels, {"source": "plain digits"})
    with pytest.raises(UserError, match="holds no MultiMNIST recipes"):
        mm.evaluate(None, cfg, tmp_path, tmp_path / "out")


def test_multimnist_prepares_its_recipes_draws_fresh_examples_and_pairs_synthetic_digits_of_two_classes(tmp_path):
    from types import SimpleNamespace

    from conftest import committed_params

    said = mm.prepare(committed_params(multimnist_pairs_per_digit=3), {"test_images": torch.zeros(10, 28, 28, dtype=torch.uint8),
                               "test_labels": torch.arange(10, dtype=torch.uint8)}, tmp_path, tmp_path)
    assert said == "MultiMNIST: 30 test recipes"
    cfg = SimpleNamespace(num_classes=10, multimnist_epoch_size=640)
    assert mm.examples_per_epoch(cfg, 60_000) == 640  # drawn fresh: not the training split's size
    data = mm.synthetic_data(cfg, 12, torch.device("cpu"))
    pairs = data["test_pairs"].long()
    assert bool((data["test_labels"][pairs[:, 0]] != data["test_labels"][pairs[:, 1]]).all())
