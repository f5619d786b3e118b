"""The report's arithmetic on fabricated per-seed evaluation files."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from pipeline import report as rp
from pipeline import report_affnist as ra

REFERENCE = rp.paper_reference()


def fabricate(root, variant, seed, error_pct, n=200, affine_pct=50.0, model="capsnet", recon=True, image_size=28,
              stop_reason="budget", bins=None, recipe=None, history=None):
    """Evaluation files whose per-image predictions give exactly error_pct (clean set) and affine_pct
    (transformed set) on n images; 40×40 variants get §5.2's set names."""
    model_dir, result_dir = root / "models" / variant / f"seed{seed}", root / "results" / variant / f"seed{seed}"
    model_dir.mkdir(parents=True)
    result_dir.mkdir(parents=True)
    clean, transformed = ("test", "affine_test") if image_size == 28 else ("expanded_test", "affnist_test")
    labels = torch.zeros(n, dtype=torch.uint8)
    preds = labels.clone()
    preds[: round(n * error_pct / 100)] = 1
    affine_preds = labels.clone()
    affine_preds[: round(n * affine_pct / 100)] = 1
    save_file({f"{clean}_labels": labels, f"{clean}_preds": preds, f"{transformed}_labels": labels.clone(),
               f"{transformed}_preds": affine_preds}, str(result_dir / "predictions.safetensors"))
    (result_dir / "metrics.json").write_text(json.dumps(
        {"error_pct": error_pct, "transformed_error_pct": affine_pct, "n_test": n, "n_transformed": n,
         "n_params": 8215568, "epochs_trained": 1, "reached_target": stop_reason == "target"}))
    (result_dir / "breakdown.json").write_text(json.dumps(
        {"per_class": {}, "sources": {transformed: f"{transformed} (fabricated)"}, "bins": bins or {}}))
    config = {"model": model, "routing_iterations": 3, "reconstruction": recon, "image_size": image_size,
              "target_accuracy_pct": 99.23 if image_size == 40 else 0.0}
    if recipe is not None:  # runs from before recipes existed have none
        config["recipe"] = recipe
    (model_dir / "config.json").write_text(json.dumps(
        {"config": config, "train_seconds": 1.0, "stop_reason": stop_reason, "epochs_trained": 1}))
    history = history or [error_pct]
    pd.DataFrame({"epoch": range(1, len(history) + 1), "test_error_pct": history,
                  "epoch_seconds": [1.0] * len(history)}).to_csv(model_dir / "history.csv", index=False)


def test_means_stds_and_deltas(tmp_path):
    for seed, err in enumerate([0.5, 1.0, 1.5]):
        fabricate(tmp_path, "capsnet_r3_recon", seed, err)
    runs = rp.load_runs(tmp_path / "models", tmp_path / "results", ["capsnet_r3_recon"], [0, 1, 2])
    row = rp.summarize(runs, REFERENCE).iloc[0]
    assert row.n_seeds == 3
    assert row.test_error_mean == pytest.approx(1.0)
    assert row.test_error_std == pytest.approx(0.5)  # sample std of 0.5, 1.0, 1.5
    assert row.delta == pytest.approx(1.0 - 0.25)
    assert row.paper_test_error == 0.25 and row.paper_test_error_std == 0.005
    assert row.test_errors == "0.50 1.00 1.50"
    assert row.verdict == "not reproduced"


@pytest.mark.parametrize("mean,paper,std,expected", [
    (0.31, 0.25, 0.005, "reproduced"),        # exactly 2σ with σ = max(0.005, 0.03) = 0.03
    (0.3101, 0.25, 0.005, "not reproduced"),  # just outside
    (0.19, 0.25, 0.005, "reproduced"),        # exactly 2σ below
    (0.1899, 0.25, 0.005, "better"),          # just outside, lower error
    (0.41, 0.34, 0.036, "reproduced"),        # paper σ > 0.03: 2σ = 0.072
    (0.4121, 0.34, 0.036, "not reproduced"),
    (0.45, 0.39, None, "reproduced"),         # baseline: no paper σ, floor 0.03
])
def test_verdict_boundaries(mean, paper, std, expected):
    assert rp.verdict(mean, paper, std) == expected


def test_paired_bootstrap_known_answer():
    n = 1000
    a = np.zeros((2, n), dtype=bool)
    b = np.zeros((2, n), dtype=bool)
    a[:, :100] = True  # A errs on 10 % of images in both seeds, B never: Δ = +10 pp
    diff, lo, hi = rp.paired_bootstrap(a, b)
    assert diff == pytest.approx(10.0)
    # per-image differences are Bernoulli(0.1): the CI is ≈ 10 ± 1.96·sqrt(0.09/1000)·100 ≈ 10 ± 1.86
    assert 7.8 < lo < 9.0 and 11.0 < hi < 12.2
    same, lo0, hi0 = rp.paired_bootstrap(a, a)
    assert same == 0 and lo0 == 0 and hi0 == 0


def test_effects_direction_and_noise(tmp_path):
    fabricate(tmp_path, "capsnet_r3_recon", 0, 5.0)
    fabricate(tmp_path, "capsnet_r1_recon", 0, 20.0)
    runs = rp.load_runs(tmp_path / "models", tmp_path / "results", ["capsnet_r3_recon", "capsnet_r1_recon"], [0])
    row = rp.effects(runs, REFERENCE).iloc[0]
    assert row.effect.startswith("routing 3 vs 1, with")
    assert row.our_delta == pytest.approx(-15.0) and row.paper_delta == pytest.approx(-0.04)
    assert row.same_direction and row.distinguishable_from_noise and row.ci_high < 0


def test_missing_seed_is_named(tmp_path):
    fabricate(tmp_path, "capsnet_r1", 0, 1.0)
    with pytest.raises(rp.ReportError, match="variant capsnet_r1 seed 1 has no evaluation"):
        rp.load_runs(tmp_path / "models", tmp_path / "results", ["capsnet_r1"], [0, 1])
    with pytest.raises(rp.ReportError, match="variant capsnet_r3 seed 0"):
        rp.load_runs(tmp_path / "models", tmp_path / "results", ["capsnet_r1", "capsnet_r3"], [0])


@pytest.mark.parametrize("profile", ["smoke", "paper"])
def test_smoke_banner_only_in_smoke_reports(tmp_path, profile):
    fabricate(tmp_path, "capsnet_r1", 0, 1.0)
    runs = rp.load_runs(tmp_path / "models", tmp_path / "results", ["capsnet_r1"], [0])
    text = rp.render_markdown(rp.summarize(runs, REFERENCE), rp.effects(runs, REFERENCE), profile=profile,
                              deviations=["d"], provenance={"commit": "x"}, figures={}, reference=REFERENCE)
    assert (rp.SMOKE_BANNER in text) == (profile == "smoke")
    assert "0.34 ± 0.032" in text  # the paper's value comes from the cited reference file


def test_recipe_differences_list_only_changes():
    recipe = {k: v for k, v in REFERENCE["recipe"].items() if k != "source"}
    assert rp.recipe_differences(recipe, REFERENCE) == []
    assert rp.recipe_differences({**recipe, "epochs": 50}, REFERENCE) == ["train.epochs = 50 (paper protocol: 640)"]


# --- §5.2 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("lo,hi,expected", [
    (0.0, 20.0, "not reproduced"),   # touches 0
    (-1.0, 2.0, "not reproduced"),
    (1.0, 12.9, "smaller gap"),      # above 0, wholly below the paper's 13 pp
    (1.0, 13.0, "reproduced"),       # reaches the paper's gap exactly
    (12.0, 15.0, "reproduced"),
    (13.0, 15.0, "reproduced"),      # contains 13 at its lower end
    (13.1, 15.0, "larger gap"),
])
def test_gap_verdict_boundaries(lo, hi, expected):
    assert ra.gap_verdict(lo, hi, 13.0) == expected


def test_affnist_summary_gap_and_matched_flag(tmp_path):
    # CapsNet: 1 % / 21 % error on expanded / affNIST; CNN: 1 % / 36 %; the CNN errs on a superset of
    # the CapsNet's affNIST images, so every paired difference is 0 or +1 and the gap is exactly +15 pp.
    for seed in (0, 1):
        fabricate(tmp_path, "capsnet_affnist", seed, 1.0, n=400, affine_pct=21.0, image_size=40, stop_reason="target")
        fabricate(tmp_path, "cnn_affnist", seed, 1.0, n=400, affine_pct=36.0, model="pooling_cnn", recon=False,
                  image_size=40, stop_reason="budget" if seed else "target")
    runs = rp.load_runs(tmp_path / "models", tmp_path / "results", ["capsnet_affnist", "cnn_affnist"], [0, 1])
    table = ra.affnist_summary(runs, REFERENCE).set_index("variant")
    assert table.loc["capsnet_affnist", "affnist_acc_mean"] == pytest.approx(79.0)
    assert table.loc["cnn_affnist", "affnist_acc_mean"] == pytest.approx(64.0)
    assert table.loc["capsnet_affnist", "expanded_acc_mean"] == pytest.approx(99.0)
    assert table.loc["cnn_affnist", "stopped"] == "1 1*"
    assert table.loc["capsnet_affnist", "paper_affnist_acc"] == 79.0 and table.loc["cnn_affnist", "paper_affnist_acc"] == 66.0
    gap = ra.affnist_gap(runs, REFERENCE)
    assert gap["gap"] == pytest.approx(15.0) and gap["paper_gap"] == pytest.approx(13.0)
    assert 0 < gap["ci_low"] < 15 < gap["ci_high"] and gap["verdict"] == "reproduced"
    assert gap["matched"] is False  # the CNN's seed 1 ran out of budget
    text = "\n".join(ra.render_affnist(ra.affnist_summary(runs, REFERENCE), gap, REFERENCE))
    assert "Verdict: reproduced" in text and "not compared at matched" in text
    assert "affNIST-style set" in text  # the fabricated source is not the real affNIST


def test_transform_bins_average_over_seeds(tmp_path):
    def bins(acc):
        return {"affnist_test": {"rotation_deg": {"edges": [-20, 0, 20], "count": [5, 5], "accuracy_pct": acc}}}

    fabricate(tmp_path, "capsnet_affnist", 0, 1.0, image_size=40, bins=bins([50.0, None]))
    fabricate(tmp_path, "capsnet_affnist", 1, 1.0, image_size=40, bins=bins([70.0, 80.0]))
    runs = rp.load_runs(tmp_path / "models", tmp_path / "results", ["capsnet_affnist"], [0, 1])
    out = ra.transform_bins(runs, "affnist_test")["capsnet_affnist"]["rotation_deg"]
    assert out["centres"] == [-10.0, 10.0]
    assert out["accuracy_pct"] == pytest.approx([60.0, 80.0])  # an empty bin is skipped, not counted as 0


def test_deviations_name_profile_changes_including_the_affnist_set():
    from conftest import REPO
    from pipeline.params import load_params

    committed = load_params(REPO / "params.yaml")
    assert not any("affNIST-style set" in d or "Data subsets" in d for d in rp.deviations(committed, REFERENCE))
    smoke = dataclasses.replace(committed, prepare=dataclasses.replace(committed.prepare, affnist_transforms=1, test_subset=256))
    listed = rp.deviations(smoke, REFERENCE)
    assert any("1 transform(s) per test digit" in d for d in listed) and any("256 test digits" in d for d in listed)


def test_deviations_name_a_multimnist_test_set_smaller_than_the_papers():
    from conftest import REPO
    from pipeline.params import load_params

    committed = load_params(REPO / "params.yaml")  # 1,000 partners per digit: the paper's 10M pairs
    assert not any("MultiMNIST test set" in d for d in rp.deviations(committed, REFERENCE))
    gpu = dataclasses.replace(committed, prepare=dataclasses.replace(committed.prepare, multimnist_pairs_per_digit=100))
    (line,) = [d for d in rp.deviations(gpu, REFERENCE) if "MultiMNIST test set" in d]
    assert "100 partners per test digit, 1,000,000 pairs" in line and "SE ≤ 0.050 pp" in line  # √(¼ / 1e6) = 0.0005
    no_multi = dataclasses.replace(gpu, ablation=dataclasses.replace(gpu.ablation, variants=("capsnet_r1",)))
    assert not any("MultiMNIST" in d for d in rp.deviations(no_multi, REFERENCE))


def test_cluster_bootstrap_resamples_whole_digits():
    digits, k = 100, 10
    a = np.zeros((1, digits * k), dtype=bool)
    a[0, :20 * k] = True  # A fails every transform of 20 digits, B nothing: Δ = +20 pp
    b = np.zeros_like(a)
    gap, lo, hi = rp.paired_bootstrap(a, b, groups=np.repeat(np.arange(digits), k))
    gap_images, lo_images, hi_images = rp.paired_bootstrap(a, b)
    assert gap == gap_images == pytest.approx(20.0)
    # 100 independent digits, Bernoulli(0.2): CI ≈ 20 ± 1.96·sqrt(0.16/100)·100 ≈ 20 ± 7.8 pp;
    # treating the 1,000 images as independent would claim ≈ ± 2.5 pp
    assert 11 < lo < 15 and 25 < hi < 29
    assert hi_images - lo_images < 6


def test_missing_runs_are_listed_not_estimated(tmp_path):
    fabricate(tmp_path, "capsnet_r1", 0, 1.0)
    fabricate(tmp_path, "capsnet_r1", 1, 2.0)
    fabricate(tmp_path, "capsnet_r3", 0, 1.0)
    (tmp_path / "results" / "capsnet_r3" / "seed0" / "predictions.safetensors").unlink()  # stopped before evaluation
    missing = rp.missing_runs(tmp_path / "models", tmp_path / "results", ["capsnet_r1", "capsnet_r3"], [0, 1])
    assert missing == [("capsnet_r3", 0), ("capsnet_r3", 1)]
    runs = rp.load_runs(tmp_path / "models", tmp_path / "results", ["capsnet_r1", "capsnet_r3"], [0, 1], skip=missing)
    assert [(r.variant, r.seed) for r in runs] == [("capsnet_r1", 0), ("capsnet_r1", 1)]
    text = rp.render_markdown(rp.summarize(runs, REFERENCE), rp.effects(runs, REFERENCE), profile="gpu",
                              not_run={"capsnet_r3": [0, 1]}, deviations=["d"], provenance={"commit": "x"},
                              figures={}, reference=REFERENCE)
    assert "## Not run" in text and "- capsnet_r3: seed(s) 0, 1" in text
    assert "| capsnet_r3 |" not in text.split("## Not run")[0]  # no row, no estimate


def test_published_copies_rewrite_the_same_report_without_scores(tmp_path):
    fabricate(tmp_path, "capsnet_r1", 0, 1.5)
    fabricate(tmp_path, "capsnet_r3", 0, 1.0)
    result = tmp_path / "results" / "capsnet_r3" / "seed0"
    extra = {"test_scores": torch.rand(200, 10).half()}
    from safetensors.torch import load_file
    save_file({**load_file(str(result / "predictions.safetensors")), **extra}, str(result / "predictions.safetensors"))
    (tmp_path / "results" / "capsnet_r1" / "seed1").mkdir(parents=True)  # incomplete: not published
    copied = rp.publish_runs(tmp_path / "models", tmp_path / "results", tmp_path / "pub")
    assert copied == [("capsnet_r1", 0), ("capsnet_r3", 0)]
    kept = load_file(str(tmp_path / "pub" / "results" / "capsnet_r3" / "seed0" / "predictions.safetensors"))
    assert sorted(kept) == ["affine_test_labels", "affine_test_preds", "test_labels", "test_preds"]
    original = rp.load_runs(tmp_path / "models", tmp_path / "results", ["capsnet_r1", "capsnet_r3"], [0])
    published = rp.load_runs(tmp_path / "pub" / "models", tmp_path / "pub" / "results", ["capsnet_r1", "capsnet_r3"], [0])
    pd.testing.assert_frame_equal(rp.effects(original, REFERENCE), rp.effects(published, REFERENCE))
    pd.testing.assert_frame_equal(rp.summarize(original, REFERENCE), rp.summarize(published, REFERENCE))


def test_training_commit_from_config_or_journal(tmp_path):
    fabricate(tmp_path, "capsnet_r1", 0, 1.0)
    run = rp.load_runs(tmp_path / "models", tmp_path / "results", ["capsnet_r1"], [0])[0]
    run.config.update(run_id="abc", environment={})
    assert rp.training_commit(run, tmp_path / "journal") == "not recorded"
    (tmp_path / "journal").mkdir()
    (tmp_path / "journal" / "abc.jsonl").write_text(json.dumps({"event": "start", "tags": {"git_commit": "17bb48c"}}) + "\n")
    assert rp.training_commit(run, tmp_path / "journal") == "17bb48c"
    run.config["environment"]["git_commit"] = "deadbee"
    assert rp.training_commit(run, tmp_path / "journal") == "deadbee"


def test_both_recipes_side_by_side_with_best_epoch_column(tmp_path):
    for seed, (err, history) in enumerate([(1.0, [3.0, 0.5, 1.0]), (2.0, [2.5, 2.0, 2.0])]):
        fabricate(tmp_path, "capsnet_r3_recon", seed, err, history=history)
        fabricate(tmp_path, "capsnet_r3_recon_official", seed, 0.5, recipe="official", history=[1.0, 0.5])
    variants = ["capsnet_r3_recon", "capsnet_r3_recon_official"]
    runs = rp.load_runs(tmp_path / "models", tmp_path / "results", variants, [0, 1])
    summary = rp.summarize(runs, REFERENCE).set_index("variant")
    paper, official = summary.loc["capsnet_r3_recon"], summary.loc["capsnet_r3_recon_official"]
    assert paper.recipe == "paper" and official.recipe == "official"  # a config without recipe is the paper's
    assert official.paper_test_error == 0.25 and official.verdict == "not reproduced"  # Table 1's r3+recon row
    assert official.reruns == "" and "XifengGuo" in paper.reruns
    assert paper.test_error_mean == pytest.approx(1.5)  # the final epoch's evaluation, not the best
    assert paper.best_errors == "0.50@2 2.00@2" and paper.best_error_mean == pytest.approx(1.25)
    assert paper.final_epochs == "3 3"
    effect = rp.effects(runs, REFERENCE).set_index("effect").loc["official vs paper recipe, routing 3, with reconstruction"]
    assert effect.our_delta == pytest.approx(-1.0) and np.isnan(effect.paper_delta) and effect.same_direction is None
    text = rp.render_markdown(rp.summarize(runs, REFERENCE), rp.effects(runs, REFERENCE), profile="gpu",
                              deviations=["d"], provenance={}, figures={}, reference=REFERENCE)
    assert "| capsnet_r3_recon_official | official | 3 | yes | 2 | 0.50 ± 0.00 |" in text
    assert "| capsnet_r3_recon | paper | 3 | yes | 2 | 1.50 ± 0.71 |" in text
    assert "selected on the test set, so it is optimistic" in text
    assert "| capsnet_r3_recon | 1.50 | 3 3 | 1.25 | 0.50@2 2.00@2 |" in text
    assert "| official vs paper recipe, routing 3, with reconstruction | – (no number) | -1.00 |" in text


def test_deviations_list_each_recipe_present():
    from conftest import REPO
    from pipeline import capsnet
    from pipeline.params import load_params

    committed = load_params(REPO / "params.yaml")
    listed = rp.deviations(committed, REFERENCE)
    assert all(d in listed for d in capsnet.PAPER_RECIPE_DEVIATIONS + capsnet.OFFICIAL_RECIPE_DEVIATIONS)
    paper_only = dataclasses.replace(committed, ablation=dataclasses.replace(committed.ablation, variants=("capsnet_r1",)))
    listed = rp.deviations(paper_only, REFERENCE)
    assert capsnet.PAPER_RECIPE_DEVIATIONS[0] in listed and capsnet.OFFICIAL_RECIPE_DEVIATIONS[0] not in listed


def test_runs_from_before_adam_eps_was_recorded_are_named(tmp_path):
    from pipeline import train

    for variant in ("capsnet_r1", "capsnet_r3"):
        fabricate(tmp_path, variant, 0, 1.0)
    runs = rp.load_runs(tmp_path / "models", tmp_path / "results", ["capsnet_r1", "capsnet_r3"], [0])
    (note,) = rp.run_deviations(runs)
    assert "Adam ε = 1e-07 in 2 of 2 runs (capsnet_r1, capsnet_r3)" in note
    for run in runs:
        run.config["optimizer"] = {"name": "adam", "adam_eps": train.ADAM_EPS}
    assert rp.run_deviations(runs) == []


def test_report_stage_writes_every_declared_output_whatever_the_variants(tmp_path, monkeypatch):
    """dvc.yaml declares the same report outputs for every variant list: figures with nothing to
    show say so, and the DVC plot data exist."""
    from conftest import REPO
    from pipeline import report_stage
    from pipeline.params import load_params

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    for seed in (0, 1):
        fabricate(tmp_path, "capsnet_r1", seed, 1.0 + seed, recon=False, history=[3.0, 1.0 + seed])
    p = load_params(REPO / "params.yaml")
    p = dataclasses.replace(p, ablation=dataclasses.replace(p.ablation, variants=("capsnet_r1",), seeds=(0, 1)))
    for run in rp.load_runs(tmp_path / "models", tmp_path / "results", ["capsnet_r1"], [0, 1]):
        (tmp_path / "models" / "capsnet_r1" / f"seed{run.seed}" / "config.json").write_text(json.dumps(
            {**run.config, "params": {"device": "cpu"},
             "environment": {"torch_version": "t", "python_version": "p", "device_name": "cpu", "cuda_version": "None"}}))
    (tmp_path / "reports" / "metrics").mkdir(parents=True)
    (tmp_path / "reports" / "metrics" / "capsnet_r3.json").write_text("{}")  # a variant no longer listed
    report_stage.run(p, tmp_path / "models", tmp_path / "results", tmp_path / "reports")
    [variant_metrics] = (tmp_path / "reports" / "metrics").iterdir()
    assert variant_metrics.name == "capsnet_r1.json"
    assert json.loads(variant_metrics.read_text()) == {  # means over the two seeds, the per-run keys
        "error_pct": 1.5, "transformed_error_pct": 50.0, "n_test": 200, "n_transformed": 200, "n_params": 8215568,
        "epochs_trained": 1, "reached_target": False}
    figs = tmp_path / "reports" / "figures"
    for name in ("table1_errors", "learning_curves", "reconstructions", "fig4", "affnist_bins"):
        assert (figs / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    curves = pd.read_csv(tmp_path / "reports" / "plots" / "learning_curves.csv")
    assert curves.to_dict("list") == {"variant": ["capsnet_r1"] * 2, "epoch": [1, 2], "test_error_pct": [3.0, 1.5]}
    confusion = pd.read_csv(tmp_path / "reports" / "plots" / "confusion.csv")
    assert list(confusion.columns) == ["actual", "predicted"] and len(confusion) == 200
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    [run] = client.search_runs([client.get_experiment_by_name("capsnet-repro").experiment_id])
    assert run.data.metrics["capsnet_r1/error_pct"] == pytest.approx(1.5)


@pytest.mark.parametrize("image_size, clean, transformed", [(28, "test", "affine_test"),
                                                            (40, "expanded_test", "affnist_test")])
def test_runs_evaluated_before_uniform_metric_keys_still_load(tmp_path, image_size, clean, transformed):
    """The published GPU runs' metrics.json name the sets in the keys (test_error_pct, n_affine_test)."""
    fabricate(tmp_path, "capsnet_r1", 0, 1.0, image_size=image_size)
    path = tmp_path / "results" / "capsnet_r1" / "seed0" / "metrics.json"
    path.write_text(json.dumps({f"{clean}_error_pct": 1.0, f"{transformed}_error_pct": 50.0, f"n_{clean}": 200,
                                f"n_{transformed}": 200, "n_params": 5, "epochs_trained": 1, "reached_target": False}))
    [run] = rp.load_runs(tmp_path / "models", tmp_path / "results", ["capsnet_r1"], [0])
    assert run.metrics == {"error_pct": 1.0, "transformed_error_pct": 50.0, "n_test": 200, "n_transformed": 200,
                           "n_params": 5, "epochs_trained": 1, "reached_target": False}
