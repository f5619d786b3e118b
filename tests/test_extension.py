"""Adding an experiment is one module: this file registers a tiny Fashion-MNIST-style experiment
(tests/bars_experiment.py: its own synthetic 28×28 data, each class a bar at its own place) and trains,
evaluates and reports a variant of it through the real prepare, train, evaluate and report stages,
without a line of pipeline/ knowing it exists."""

import json

import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient

import bars_experiment as experiment
from bars_experiment import N_TEST, N_TRAIN, NAME
from conftest import REPO, trust_mnist, write_mnist
from pipeline.core import registry
from pipeline.core.files import write_text
from pipeline.core.params import load_params
from pipeline.stages import evaluate as evaluate_stage
from pipeline.stages import prepare as prepare_stage
from pipeline.stages import report as report_stage
from pipeline.stages import train as train_stage


@pytest.fixture
def registered():
    registry.register(experiment)
    yield experiment
    registry.unregister(NAME)


def test_a_registered_experiment_runs_through_every_stage(tmp_path, monkeypatch, registered):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    trust_mnist(monkeypatch, write_mnist(tmp_path / "raw", n_train=32, n_test=12))
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["base"]["profile"] = "smoke"
    raw["prepare"].update(affnist_transforms=1, multimnist_pairs_per_digit=1)
    raw["train"].update(epochs=2, batch_size=8, device="cpu")
    raw["variants"]["bars_r1"] = {"model": "capsnet", "routing_iterations": 1, "reconstruction": False,
                                  "experiment": NAME}
    raw["ablation"].update(seeds=[0], stacked=[], separate=["bars_r1"])
    write_text(tmp_path / "params.yaml", yaml.safe_dump(raw))
    params = load_params(tmp_path / "params.yaml")
    assert params.variant("bars_r1").experiment == NAME and params.variant("bars_r1").image_size == 28

    data, models, results, reports = (tmp_path / d for d in ("prepared", "models", "results", "reports"))
    summary = prepare_stage.run(params, tmp_path / "raw", data, reports / "figures")
    assert f"{NAME}: {N_TRAIN} + {N_TEST} bars" in summary and (data / f"{NAME}_flipped.safetensors").is_file()
    outcome = train_stage.run(params, "bars_r1", 0, data, models / "bars_r1" / "seed0", tmp_path / "ck.pt")
    config = json.loads((models / "bars_r1" / "seed0" / "config.json").read_text())
    assert config["config"]["experiment"] == NAME and config["eval_set"] == outcome.eval_set == f"{NAME}_test"
    assert config["params"]["n_train"] == N_TRAIN  # its own training split, not MNIST's 32 digits
    metrics = evaluate_stage.run(models / "bars_r1" / "seed0", data, results / "bars_r1" / "seed0", params)
    assert metrics["n_test"] == N_TEST and metrics["n_transformed"] == N_TEST
    run = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(outcome.run_id)
    assert run.data.params["experiment"] == NAME and f"eval_{NAME}_flipped_error_pct" in run.data.metrics

    text = report_stage.run(params, models, results, reports).read_text()
    assert f"- bars_r1 seed 0: {metrics['error_pct']:.2f} %" in text
    assert pd.read_csv(reports / f"{NAME}.csv").error_pct.tolist() == [metrics["error_pct"]]
    for name in ("table1_errors", "table1_effects", "learning_curves", "affnist_bins"):  # every declared output, whatever the variants
        assert (reports / "figures" / f"{name}.png").is_file()


def test_an_unregistered_experiment_is_one_clear_params_error(tmp_path):
    from pipeline.core.params import ParamsError

    text = (REPO / "params.yaml").read_text().replace("experiment: multimnist}", f"experiment: {NAME}}}", 1)
    (tmp_path / "params.yaml").write_text(text)
    with pytest.raises(ParamsError, match=f"unknown experiment '{NAME}'; known: table1, affnist, multimnist"):
        load_params(tmp_path / "params.yaml")


def test_the_registry_index_is_what_each_module_says():
    """params check variants against the registry's index so that reading params.yaml imports no
    experiment (nor torch); the index must be what the modules themselves declare."""
    for name, entry in registry.EXPERIMENTS.items():
        module = registry.load(name)
        assert (module.NAME, module.IMAGE_SIZE, tuple(module.MODELS)) == (name, entry.image_size, entry.models)


def test_reading_params_imports_no_experiment_and_no_torch():
    import subprocess
    import sys

    code = ("import sys; from pipeline.core.params import load_params; load_params('params.yaml'); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('pipeline.experiments')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_registry_answers_for_a_plugin_by_what_the_plugin_says_and_refuses_a_name_nobody_gave():
    """A registered module is its own source (its image size and models, not a built-in's), one
    registered under a built-in's name replaces it and is listed once, and a name nothing registered
    is one clear line at every door (load, entry, a record's image size), never a KeyError."""
    import types

    from pipeline.core.errors import UserError

    wide = types.ModuleType("tests.wide_bars")
    wide.NAME, wide.IMAGE_SIZE, wide.MODELS = "wide_bars", 32, ["capsnet"]
    shadow = types.ModuleType("tests.shadow_table1")
    shadow.NAME, shadow.IMAGE_SIZE, shadow.MODELS = "table1", 28, ["capsnet"]
    registry.register(wide)
    registry.register(shadow)
    try:
        assert registry.entry("wide_bars") == registry.Entry("tests.wide_bars", 32, ("capsnet",))
        assert registry.load("table1") is shadow and registry.entry("table1").module == "tests.shadow_table1"
        assert registry.names() == ["table1", "affnist", "multimnist", "wide_bars"]
    finally:
        registry.unregister("wide_bars")
        registry.unregister("table1")
    assert registry.names() == ["table1", "affnist", "multimnist"]
    for door in (registry.load, registry.entry):
        with pytest.raises(UserError, match="unknown experiment 'fashion'; known: table1, affnist, multimnist"):
            door("fashion")
    assert registry.of_record(None, 40) == "affnist" and registry.of_record("wide_bars", 40) == "wide_bars"
    with pytest.raises(UserError, match="its image size 32 is none of the built-in ones .*add `experiment:`"):
        registry.of_record(None, 32)
