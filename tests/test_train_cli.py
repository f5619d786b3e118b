"""The train and evaluate stages' CLI on a tiny prepared pipeline: one MLflow run per variant and seed,
stacked seeds, §5.2's variants, a failed run, the rerun hints and the fan-out items."""

import json

import pytest
import yaml
from click.testing import CliRunner

from conftest import REPO, tiny_pipeline, with_ablation
from mlflow.tracking import MlflowClient

from pipeline.core import provenance, tracking
from pipeline.core.errors import UserError
from pipeline.core.params import load_params
from pipeline.data import splits
from pipeline.report import runs as rr
from pipeline.training import stack as stack_module


def test_tracking_uri_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert tracking.tracking_uri() == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("DVC_ROOT", "/somewhere/repo")
    assert tracking.tracking_uri() == "sqlite:////somewhere/repo/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://localhost:5000")
    assert tracking.tracking_uri() == "http://localhost:5000"


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory):
    """Prepared synthetic data and a params.yaml for a one-epoch CPU run."""
    return tiny_pipeline(tmp_path_factory.mktemp("pipe"))


def run_cli(args, root, monkeypatch):
    from pipeline.cli import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root}/mlflow.db")
    monkeypatch.setenv("DVC_ROOT", str(root))
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_train_and_evaluate_cli_log_one_run_per_variant(pipeline_dir, monkeypatch):
    root = pipeline_dir
    for variant in ("baseline_cnn", "capsnet_r1_recon"):
        model_dir, out_dir = root / "models" / variant, root / "results" / variant
        result = run_cli(["train", variant, "0", str(root / "prepared"), str(model_dir),
                          "--checkpoint", str(root / "ckpt" / f"{variant}.pt"), "--params", str(root / "params.yaml")], root, monkeypatch)
        assert result.exit_code == 0, result.output
        result = run_cli(["evaluate", str(model_dir), str(root / "prepared"), str(out_dir)], root, monkeypatch)
        assert result.exit_code == 0, result.output
        metrics = json.loads((out_dir / "metrics.json").read_text())
        assert set(metrics) == set(rr.METRIC_KEYS)  # the same keys for every variant
        assert 0 <= metrics["error_pct"] <= 100 and 0 <= metrics["transformed_error_pct"] <= 100
    assert (root / "results" / "capsnet_r1_recon" / "figures" / "fig4.png").is_file()
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    experiment = client.get_experiment_by_name(tracking.experiment_name("smoke"))
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["baseline_cnn-seed0", "capsnet_r1_recon-seed0"]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert all(sorted(r.data.params) == sorted(provenance.PARAM_KEYS) for r in runs)
    assert {r.data.params["n_params"] for r in runs} == {"35445522", "8215568"}
    assert all({"test_error_pct", "eval_test_error_pct", "eval_affine_test_error_pct", "train_loss", "lr"}
               <= set(r.data.metrics) for r in runs)
    # the Dataset column: what each run trained on, was tested on each epoch, and was evaluated on
    expected = {(d["name"], d["digest"], context) for name, context in
                (("train", "training"), ("test", "testing"), ("affine_test", "evaluation"))
                for path in [root / "prepared" / f"{name}.safetensors"]
                for d in [splits.dataset_input(path, splits.load_split(path), context)]}
    for r in runs:
        inputs = r.inputs.dataset_inputs
        assert {(i.dataset.name, i.dataset.digest, {t.key: t.value for t in i.tags}["mlflow.data.context"])
                for i in inputs} == expected
        train_input = next(i for i in inputs if i.dataset.name == "train")
        assert json.loads(train_input.dataset.profile)["num_rows"] == int(r.data.params["n_train"])
        assert json.loads(train_input.dataset.source) == {"uri": "prepared/train.safetensors"}  # repo-relative


def test_train_cli_stacks_several_seeds_with_one_run_and_directory_per_seed(pipeline_dir, monkeypatch):
    """`capsnet train V 0,1 … 'models/V/seed{seed}'`: one process, each seed's outputs and MLflow run as
    a one-seed run writes them (evaluate reads them unchanged); several seeds without {seed} refused.
    (capsnet_r3: no other test of this module's shared store logs it.)"""
    root = pipeline_dir
    args = ["train", "capsnet_r3", "0,1", str(root / "prepared")]
    tail = ["--checkpoint", str(root / "ckpt" / "stack.pt"), "--params", str(root / "params.yaml")]
    refused = run_cli([*args, str(root / "models" / "capsnet_r3"), *tail], root, monkeypatch)
    assert refused.exit_code == 2 and "{seed}" in refused.output
    assert run_cli(["train", "capsnet_r3", "0,x", str(root / "prepared"), "m", *tail], root, monkeypatch).exit_code == 2
    result = run_cli([*args, str(root / "models" / "capsnet_r3" / "seed{seed}"), *tail], root, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "capsnet_r3 seed 0: final" in result.output and "capsnet_r3 seed 1: final" in result.output
    for seed in (0, 1):
        model_dir = root / "models" / "capsnet_r3" / f"seed{seed}"
        config = json.loads((model_dir / "config.json").read_text())
        assert config["config"]["seed"] == seed and config["stacked_seeds"] == [0, 1]
        done = run_cli(["evaluate", str(model_dir), str(root / "prepared"), str(root / "results" / f"s{seed}")],
                       root, monkeypatch)
        assert done.exit_code == 0, done.output
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name(tracking.experiment_name("smoke")).experiment_id],
                              "attributes.run_name LIKE 'capsnet_r3-seed%'")  # the module's other tests log too
    assert sorted(r.info.run_name for r in runs) == ["capsnet_r3-seed0", "capsnet_r3-seed1"]
    assert all(r.info.status == "FINISHED" and r.data.params["seed"] == r.info.run_name[-1] for r in runs)
    assert all("eval_test_error_pct" in r.data.metrics for r in runs)  # evaluate found each seed's own run
    assert all({i.dataset.name for i in r.inputs.dataset_inputs} == {"train", "test", "affine_test"} for r in runs)


def test_evaluating_against_a_store_without_the_training_run_says_so_and_keeps_the_evaluation(
        pipeline_dir, monkeypatch, tmp_path):
    """A model trained against one MLflow store, evaluated with MLFLOW_TRACKING_URI naming another
    (a fresh clone's, say): the evaluation is written and a warning names the run, the store and the
    fix, instead of MLflow's "Run ... not found" traceback."""
    from pipeline.cli import main

    root, model_dir = pipeline_dir, tmp_path / "model"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/trained.db")  # not the module's shared store
    trained = CliRunner().invoke(main, ["train", "capsnet_r1", "0", str(root / "prepared"), str(model_dir),
                                        "--checkpoint", str(tmp_path / "ckpt.pt"), "--params", str(root / "params.yaml")],
                                 catch_exceptions=False)
    assert trained.exit_code == 0, trained.output
    run_id = json.loads((model_dir / "config.json").read_text())["run_id"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/other.db")
    with pytest.warns(UserWarning, match=rf"MLflow run {run_id}, which the tracking store .*other.db does not hold.*"
                                         "MLFLOW_TRACKING_URI set to the store the model was trained with"):
        done = CliRunner().invoke(main, ["evaluate", str(model_dir), str(root / "prepared"), str(tmp_path / "out")],
                                  catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert 0 <= json.loads((tmp_path / "out" / "metrics.json").read_text())["error_pct"] <= 100


def test_section_5_2_variants_train_evaluate_and_report(pipeline_dir, monkeypatch):
    root = pipeline_dir
    params = root / "params_s52.yaml"
    raw = yaml.safe_load((root / "params.yaml").read_text())
    raw["ablation"] = {"seeds": [0], "stacked": [], "separate": ["capsnet_r1", "capsnet_affnist", "cnn_affnist"]}
    params.write_text(yaml.safe_dump(raw))
    models, results = root / "s52" / "models", root / "s52" / "results"
    (root / "s52").mkdir()
    store = root / "s52"  # its own MLflow store: the other tests count their runs
    for variant in ("capsnet_r1", "capsnet_affnist", "cnn_affnist"):
        result = run_cli(["train", variant, "0", str(root / "prepared"), str(models / variant / "seed0"),
                          "--checkpoint", str(root / "s52" / "ckpt" / f"{variant}.pt"), "--params", str(params)],
                         store, monkeypatch)
        assert result.exit_code == 0, result.output
        result = run_cli(["evaluate", str(models / variant / "seed0"), str(root / "prepared"),
                          str(results / variant / "seed0")], store, monkeypatch)
        assert result.exit_code == 0, result.output
    metrics = json.loads((results / "capsnet_affnist" / "seed0" / "metrics.json").read_text())
    assert set(metrics) == set(rr.METRIC_KEYS)
    assert metrics["n_transformed"] == 2 * metrics["n_test"]  # affNIST-style: 2 transforms per digit here
    assert metrics["n_params"] == 13_475_648
    breakdown = json.loads((results / "cnn_affnist" / "seed0" / "breakdown.json").read_text())
    assert set(breakdown["bins"]["affnist_test"]) == {"rotation_deg", "shear", "scale_x", "scale_y"}
    assert "affNIST-style" in breakdown["sources"]["affnist_test"]
    config = json.loads((models / "cnn_affnist" / "seed0" / "config.json").read_text())
    assert config["eval_set"] == "expanded_test" and config["stop_reason"] in ("target", "budget")
    assert config["optimizer"] == {"name": "adam", "adam_eps": 1e-8}
    assert config["resumed_at_epochs"] == [] and config["environment"]["git_commit"]  # the report reads these
    result = run_cli(["report", str(models), str(results), str(root / "s52" / "reports"), "--params", str(params)],
                     store, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "the paper's claims as these runs read them (SMOKE RUN: tiny data, 1 epoch;" in result.output
    assert "  §5.2: CapsNet is more robust to affine transformations than a CNN (affNIST accuracy): " in result.output
    text = (root / "s52" / "reports" / "ablation.md").read_text()
    assert "## §5.2 Robustness to affine transformations" in text and "CapsNet − CNN on affNIST" in text
    assert "test-set sampling of test digits (all transforms of a digit together)" in text  # clustered by digit
    assert "Adam ε is not recorded" not in text and "| not recorded |" not in text  # runs trained today record it all
    assert (root / "s52" / "reports" / "figures" / "affnist_bins.png").read_bytes()[:4] == b"\x89PNG"
    variant_metrics = {p.stem: json.loads(p.read_text()) for p in (root / "s52" / "reports" / "metrics").iterdir()}
    assert set(variant_metrics) == {"capsnet_r1", "capsnet_affnist", "cnn_affnist"}
    assert variant_metrics["cnn_affnist"]["error_pct"] == pytest.approx(
        json.loads((results / "cnn_affnist" / "seed0" / "metrics.json").read_text())["error_pct"], abs=1e-4)


@pytest.mark.parametrize("variant, stage", [("capsnet_r1", "train_stacked@capsnet_r1"),
                                            ("baseline_cnn", "train@baseline_cnn-0")])
def test_a_missing_model_names_the_train_stage_that_exists(pipeline_dir, monkeypatch, variant, stage):
    """models/<variant>/seed0 without its config.json: the hint is the train stage params.yaml's
    ablation makes for the variant (stacked: train_stacked@<variant>; separate: train@<variant>-<seed>)."""
    model_dir = pipeline_dir / "hints" / variant / "seed0"
    model_dir.mkdir(parents=True)
    result = run_cli(["evaluate", str(model_dir), str(pipeline_dir / "prepared"), str(pipeline_dir / "hints" / "out"),
                      "--params", str(REPO / "params.yaml")], pipeline_dir, monkeypatch)
    assert result.exit_code == 1 and f"retrain it with `dvc repro -f {stage}`" in result.output, result.output


def test_a_hint_without_a_stage_name_names_what_lists_them():
    """Where params.yaml's ablation does not hold the pair, or the folder is not models/<variant>/seed<k>
    (`capsnet evaluate m …`), the hint names no made-up stage: it points at the stage list."""
    from pipeline.core.stage_names import rerun_hint

    listing = "(`capsnet stages --kind stages` lists every stage)"
    assert rerun_hint(None, "capsnet_r9", 4, "train") == f"the train stage of capsnet_r9 seed 4 {listing}"
    assert rerun_hint(None, "", "m", "train") == f"the train stage that writes it {listing}"


def test_the_fan_out_items_are_the_stacked_variants_then_each_separate_variants_seeds_and_name_their_stages():
    """What `capsnet stages` lists and an array task picks by index: stacked variants first (the longest
    work), then <variant>-<seed> with variants outer as DVC orders its matrix; each item's stages in
    order; an item or index not there is one line saying what to do, and a hint names its stage."""
    from pipeline.core import stage_names as names

    params = with_ablation(load_params(REPO / "params.yaml"), seeds=[0, 2], stacked=["capsnet_r1"],
                           separate=["baseline_cnn", "cnn_affnist"])
    items = names.items(params)
    assert items == ["capsnet_r1", "baseline_cnn-0", "baseline_cnn-2", "cnn_affnist-0", "cnn_affnist-2"]
    assert names.stage_names(params, "capsnet_r1") == [
        "train_stacked@capsnet_r1", "evaluate_stacked@capsnet_r1-0", "evaluate_stacked@capsnet_r1-2"]
    assert names.stage_names(params, "cnn_affnist-2") == ["train@cnn_affnist-2", "evaluate@cnn_affnist-2"]
    for wrong in ("capsnet_r3", "baseline_cnn-1"):
        with pytest.raises(UserError, match=f"'{wrong}' is not an item of params.yaml's ablation; `capsnet stages`"):
            names.stage_names(params, wrong)
    assert names.item_at(items, 4) == "cnn_affnist-2"
    for index in (5, -1):
        with pytest.raises(UserError, match=f"task index {index} is outside the 5 items .* submit the array as 0-4"):
            names.item_at(items, index)
    assert names.rerun_hint(params, "capsnet_r1", 2, "evaluate") == "`dvc repro -f evaluate_stacked@capsnet_r1-2`"
    assert names.rerun_hint(params, "capsnet_r1", "m", "train").startswith("the train stage that writes it")


def test_non_finite_loss_fails_the_mlflow_run(pipeline_dir, monkeypatch):
    from pipeline.stages import train as train_stage

    root = pipeline_dir
    # the fingerprint trains a few steps with the patched loss before the run opens: a constant here, so
    # the NaN reaches the tracked run whether or not an earlier test of this process cached the real one
    monkeypatch.setattr(train_stage, "training_fingerprint", lambda cfg: "0" * 16)
    real = stack_module.compute_loss
    monkeypatch.setattr(stack_module, "compute_loss",
                        lambda m, x, y, capsnet, targets=None, keep=None: tuple(
                            t * float("nan") for t in real(m, x, y, capsnet, targets, keep)))
    result = run_cli(["train", "capsnet_r1", "0", str(root / "prepared"), str(root / "models" / "nan"),
                      "--checkpoint", str(root / "ckpt" / "nan.pt"), "--params", str(root / "params.yaml")], root, monkeypatch)
    assert result.exit_code == 1 and "non-finite loss at step" in result.output
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    experiment = client.get_experiment_by_name(tracking.experiment_name("smoke"))
    [run] = client.search_runs([experiment.experiment_id], "attributes.run_name = 'capsnet_r1-seed0'")
    assert run.info.status == "FAILED"


def test_tracker_requires_the_common_param_keys(tmp_path):
    tracker = tracking.Tracker(f"sqlite:///{tmp_path}/m.db")
    with pytest.raises(ValueError, match="run params lack"):
        tracker.start("x-seed0", {"variant": "x"})
