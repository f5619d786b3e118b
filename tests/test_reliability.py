"""No run left half-done: MLflow store creation under concurrency, FAILED on every failure path
(SIGTERM too), stale RUNNING runs closed, one trainer per checkpoint, and one clear line for bad input."""

import os
import signal

import pytest
import torch
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from conftest import disk_full, tiny_pipeline
from pipeline.core import provenance, tracking
from pipeline.core.errors import UserError, first_line
from pipeline.core.files import atomic_path, file_lock
from pipeline.stages import train as train_stage
from pipeline.training.checkpoint import NonFiniteLossError, save_checkpoint


@pytest.fixture
def stage(tmp_path, monkeypatch):
    """Prepared tiny data, a one-epoch smoke params file and a fresh MLflow store; returns a runner."""
    from pipeline.cli import main

    tiny_pipeline(tmp_path, transforms_per_digit=1)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))

    def train(*extra, params="params.yaml", catch=True):
        args = ["train", "capsnet_r1", "0", str(tmp_path / "prepared"), str(tmp_path / "models"),
                "--checkpoint", str(tmp_path / "ckpt" / "r1.pt"), "--params", str(tmp_path / params), *extra]
        return CliRunner().invoke(main, args, catch_exceptions=catch)

    return tmp_path, train


def runs(root):
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    experiment = client.get_experiment_by_name(tracking.experiment_name("smoke"))
    return [] if experiment is None else client.search_runs([experiment.experiment_id])


def one_line_error(result, *fragments):
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1, result.output  # no traceback
    for fragment in fragments:
        assert fragment in result.output, result.output


def _open_store(uri: str, start, results) -> None:
    start.wait()
    try:
        results.put(tracking.Tracker(uri).experiment_id)
    except BaseException as err:  # noqa: BLE001 - reported to the test
        results.put(f"error: {err!r}")


def test_concurrent_stages_create_a_fresh_store_once(tmp_path, monkeypatch):
    """Four stage processes open one fresh sqlite store at the same moment (forked from this one,
    with MLflow imported, and released together by a barrier): one store, one experiment."""
    import multiprocessing

    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    uri = f"sqlite:///{tmp_path}/fresh.db"
    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(4), context.Queue()
    procs = [context.Process(target=_open_store, args=(uri, start, results)) for _ in range(4)]
    for p in procs:
        p.start()
    ids = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0] * 4 and not [i for i in ids if i.startswith("error")], ids
    assert len(set(ids)) == 1  # one experiment, the same id for all
    experiment = MlflowClient(uri).get_experiment_by_name(tracking.EXPERIMENT)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI's Model training view


def test_a_failure_while_writing_outputs_marks_the_run_failed(stage, monkeypatch):
    root, train = stage

    monkeypatch.setattr(train_stage, "save_file", disk_full)
    result = train()
    assert isinstance(result.exception, OSError)
    [run] = runs(root)
    assert run.info.status == "FAILED"
    assert not (root / "models" / "model.safetensors").exists()
    assert not list((root / "models").glob(".*tmp*"))  # no half-written temporary left


def test_an_error_in_one_line_is_its_messages_first_line_cut_or_its_types_name():
    """What a warning or a record quotes of an exception: the first non-blank line, at most ``limit``
    characters; an exception without a message is named by its type."""
    assert first_line(RuntimeError("\n  CUDA error: out of memory\nCompile with TORCH_USE_CUDA_DSA")) == \
        "CUDA error: out of memory"
    assert first_line(ValueError("x" * 200)) == "x" * 160 and first_line(ValueError("abcdef"), 4) == "abcd"
    assert first_line(KeyboardInterrupt()) == "KeyboardInterrupt" and first_line(OSError("  ")) == "OSError"


def test_sigterm_marks_the_run_failed(stage, monkeypatch):
    root, train = stage

    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not interrupt")

    monkeypatch.setattr(train_stage, "train_group", killed)
    result = train()
    assert result.exit_code == 143 and "Terminated: stopped by signal 15" in result.output
    [run] = runs(root)
    assert run.info.status == "FAILED"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is put back


def test_a_stale_running_run_is_closed_when_the_stage_runs_again(stage):
    root, train = stage
    tracker = tracking.Tracker(profile="smoke")  # the stage's params are the smoke profile's
    params = {k: "x" for k in provenance.PARAM_KEYS}
    done = tracker.start("capsnet_r1-seed0", params)  # an earlier run of this seed that ended (another protocol)
    tracker.end(done)
    stale = tracker.start("capsnet_r1-seed0", params)  # a trainer killed by SIGKILL: never said it ended
    other = tracker.start("capsnet_r3-seed0", params)
    result = train()
    assert result.exit_code == 0, result.output
    status = {r.info.run_id: r for r in runs(root)}
    assert status[stale].info.status == "FAILED" and "closed_as_stale_by" in status[stale].data.tags
    assert status[other].info.status == "RUNNING"  # another (variant, seed) is not touched
    assert status[done].info.status == "FINISHED" and "closed_as_stale_by" not in status[done].data.tags  # nor an ended one
    [new] = [r for r in status.values() if r.info.run_id not in (stale, other, done)]
    assert new.info.status == "FINISHED" and "closed_as_stale_by" not in new.data.tags  # it closes others, not itself
    assert {"image_size": "28", "n_train": "32", "n_test": "12", "recipe": "paper"}.items() <= new.data.params.items()
    assert new.data.tags["git_commit"]


def test_two_trainers_never_share_a_checkpoint(stage):
    root, train = stage
    with file_lock(root / "ckpt" / "r1.pt.lock", wait=False):
        result = train()
    one_line_error(result, "capsnet_r1 seed 0's checkpoint", "in use by another process")
    assert runs(root) == []  # refused before any MLflow run


def test_corrupt_prepared_data_names_the_file_and_the_fix(stage):
    root, train = stage
    path = root / "prepared" / "train.safetensors"
    path.write_bytes(path.read_bytes()[:100])  # truncated
    result = train()
    one_line_error(result, str(path), "truncated or corrupt", "dvc repro -f prepare")
    assert runs(root) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_cuda_is_one_line(stage):
    root, train = stage
    (root / "cuda.yaml").write_text((root / "params.yaml").read_text().replace("device: cpu", "device: cuda"))
    one_line_error(train(params="cuda.yaml"), "train.device is 'cuda'", "sees no CUDA device", "train.device: auto")
    assert runs(root) == []


def test_an_unwritable_output_directory_is_named(stage):
    root, train = stage
    (root / "a-file").write_text("")
    from pipeline.cli import main

    args = ["train", "capsnet_r1", "0", str(root / "prepared"), str(root / "a-file" / "models"),
            "--checkpoint", str(root / "ckpt" / "r1.pt"), "--params", str(root / "params.yaml")]
    one_line_error(CliRunner().invoke(main, args), f"cannot write the output directory {root / 'a-file' / 'models'}")
    assert runs(root) == []
    args = ["train", "capsnet_r1", "0", str(root / "prepared"), str(root / "models"),
            "--checkpoint", str(root / "a-file" / "r1.pt"), "--params", str(root / "params.yaml")]
    one_line_error(CliRunner().invoke(main, args), f"cannot write the checkpoint directory {root / 'a-file'}")
    assert runs(root) == []


def test_a_batch_larger_than_the_data_stops_before_any_run(stage):
    root, train = stage
    (root / "big.yaml").write_text((root / "params.yaml").read_text().replace("batch_size: 16", "batch_size: 64"))
    one_line_error(train(params="big.yaml"), "train.batch_size 64 exceeds the 32 training images")
    assert runs(root) == []


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_are_never_checkpointed(tmp_path, bad):
    weights = {"w": torch.tensor([1.0, bad]), "steps": torch.tensor([3])}
    with pytest.raises(NonFiniteLossError, match="non-finite weights in w"):
        save_checkpoint(tmp_path / "c.pt", {"stack": weights}, weights)
    assert list(tmp_path.iterdir()) == []


def test_atomic_writes_use_unique_temporary_names(tmp_path):
    with atomic_path(tmp_path / "x.json") as a, atomic_path(tmp_path / "x.json") as b:
        assert a != b and a.parent == b.parent == tmp_path
        a.write_text("1")
        b.write_text("2")
    assert (tmp_path / "x.json").read_text() == "1"  # the last rename wins; neither write is torn
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_a_run_picked_up_by_other_training_code_says_so_and_records_both_fingerprints(stage, monkeypatch):
    """A checkpoint written under one training fingerprint and picked up under another: the same MLflow
    run goes on (its id from the checkpoint), a warning names both fingerprints and config.json records
    the earlier one beside the current; picked up by the same code, it records none and logs nothing twice."""
    import json

    root, train = stage
    monkeypatch.setattr(train_stage, "training_fingerprint", lambda cfg: "a" * 16)
    for resumed_from in (0, 1):  # trained, then found finished (its one epoch done) by the same code
        result = train(catch=False)
        assert result.exit_code == 0, result.output
        config = json.loads((root / "models" / "config.json").read_text())
        assert config["training_fingerprint"] == "a" * 16 and "earlier_training_fingerprints" not in config
        assert config["resumed_from_epoch"] == resumed_from
    run_id = config["run_id"]
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    assert {a.path for a in client.list_artifacts(run_id)} == set(train_stage.ARTIFACTS)
    monkeypatch.setattr(train_stage, "training_fingerprint", lambda cfg: "b" * 16)
    with pytest.warns(UserWarning, match=f"capsnet_r1 seed 0 resumes a checkpoint trained by other training code "
                                         f"\\(fingerprint {'a' * 16}, now {'b' * 16}\\): its config.json records both"):
        assert train(catch=False).exit_code == 0
    config = json.loads((root / "models" / "config.json").read_text())
    assert config["training_fingerprint"] == "b" * 16 and config["earlier_training_fingerprints"] == ["a" * 16]
    [run] = runs(root)
    assert config["run_id"] == run.info.run_id == run_id and run.data.tags["training_fingerprint"] == "b" * 16
    assert [m.step for m in client.get_metric_history(run_id, "epochs_trained")] == [1]  # logged once, not per pick-up


def test_sigterm_raises_is_a_no_op_off_the_main_thread():
    """Python lets only the main thread set signal handlers: a stage run in a thread (a notebook's
    executor, a test harness) trains without the SIGTERM hook instead of failing at signal.signal."""
    import threading

    before, errors = signal.getsignal(signal.SIGTERM), []

    def body():
        try:
            with train_stage.sigterm_raises():
                pass
        except Exception as err:  # noqa: BLE001 - whatever it raises is the failure
            errors.append(err)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert errors == [] and signal.getsignal(signal.SIGTERM) is before


def _stub_training(tmp_path, monkeypatch, results):
    """run_group's inputs for `capsnet_r1` seeds 0 and 1 without training: tiny data and no datasets, a
    fixed fingerprint, and train_group replaced by ``results(cfgs)`` (a TrainResult per seed). Returns the
    params (smoke, 5 epochs of batches of 16, on the CPU) and what the stage handed over: the extras given
    to train_group and each learning curve's title."""
    import dataclasses

    from conftest import REPO, tiny_data
    from pipeline.core.params import load_params
    from pipeline.experiments import table1

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.setattr(table1, "training_data", lambda data_dir, cfg: (tiny_data(), []))
    monkeypatch.setattr(train_stage, "training_fingerprint", lambda cfg: "f" * 16)
    monkeypatch.setattr(train_stage, "fingerprint_environment", lambda: "cpu, torch x")
    seen = {"curves": []}

    def train_group(cfgs, data, checkpoint, loggers, extras, state):
        seen["extras"] = extras
        return results(cfgs)

    def learning_curves(history, title, path):
        seen["curves"].append(title)
        path.write_bytes(b"png")

    monkeypatch.setattr(train_stage, "train_group", train_group)
    monkeypatch.setattr(train_stage.figures, "learning_curves", learning_curves)
    params = load_params(REPO / "params.yaml")
    base = dataclasses.replace(params.base, profile="smoke")
    train = dataclasses.replace(params.train, epochs=5, batch_size=16, device="cpu")
    return dataclasses.replace(params, base=base, train=train), seen


def test_each_seed_s_result_is_written_and_logged_as_its_own(tmp_path, monkeypatch):
    """run_group with training stubbed: each seed's config.json records its own result (steps, epochs,
    stop reason, resumes), the group's seeds, the fingerprint and its environment, and the wall time;
    history.csv keeps the history's column order; each learning curve is titled with its seed; each run
    logs its epochs trained and whether it reached the target at its last epoch."""
    import json

    from pipeline.training.train import TrainResult, build_model

    history = [{"epoch": e, "train_loss": 1.0 / e, "test_error_pct": 9.0 - e, "lr": 1e-3} for e in (1, 2)]

    def results(cfgs):
        return [TrainResult(build_model(c), history, steps=6 + k, resumed_from_epoch=0, resumed_at=[k],
                            stop_reason=("target", "budget")[k]) for k, c in enumerate(cfgs)]

    params, seen = _stub_training(tmp_path, monkeypatch, results)
    outs = [tmp_path / "models" / f"seed{s}" for s in (0, 1)]
    outcomes = train_stage.run_group(params, "capsnet_r1", [0, 1], tmp_path / "data", outs, tmp_path / "c.pt")
    assert seen["extras"] == [{"run_id": o.run_id, "fingerprint": "f" * 16} for o in outcomes]
    assert seen["curves"] == ["capsnet_r1 seed 0", "capsnet_r1 seed 1"]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    for k, (out, outcome) in enumerate(zip(outs, outcomes)):
        config = json.loads((out / "config.json").read_text())
        assert (config["steps_trained"], config["epochs_trained"]) == (6 + k, 2)
        assert config["stop_reason"] == outcome.stop_reason == ("target", "budget")[k]
        assert (config["resumed_from_epoch"], config["resumed_at_epochs"], config["stacked_seeds"]) == (0, [k], [0, 1])
        assert config["training_fingerprint"] == "f" * 16
        assert config["environment"]["fingerprint_environment"] == "cpu, torch x"
        assert config["train_seconds"] > 0 and config["params"]["epochs"] == 5
        assert (out / "history.csv").read_text().splitlines()[0] == "epoch,train_loss,test_error_pct,lr"
        logged = {m: [(x.step, x.value) for x in client.get_metric_history(outcome.run_id, m)]
                  for m in ("epochs_trained", "reached_target")}
        assert logged == {"epochs_trained": [(2, 2.0)], "reached_target": [(2, 1.0 - k)]}


def test_a_seed_s_non_finite_weights_stop_the_group_before_its_model_is_written(tmp_path, monkeypatch):
    """Weights that come back from training non-finite are never saved as a model: the stage stops
    naming the seed, and the group's runs end FAILED."""
    from pipeline.training.train import TrainResult, build_model

    def results(cfgs):
        models = [build_model(c) for c in cfgs]
        with torch.no_grad():
            next(models[1].parameters()).fill_(float("nan"))
        return [TrainResult(m, [{"epoch": 1, "train_loss": 1.0}], 3, 0, [], "budget") for m in models]

    params, _ = _stub_training(tmp_path, monkeypatch, results)
    outs = [tmp_path / "models" / f"seed{s}" for s in (0, 1)]
    with pytest.raises(NonFiniteLossError, match="capsnet_r1 seed 1: non-finite weights"):
        train_stage.run_group(params, "capsnet_r1", [0, 1], tmp_path / "data", outs, tmp_path / "c.pt")
    assert not (outs[1] / "model.safetensors").exists()
    assert sorted(r.info.status for r in runs(tmp_path)) == ["FAILED", "FAILED"]


def test_every_seed_s_output_directory_is_checked_before_any_work(tmp_path, monkeypatch):
    params, seen = _stub_training(tmp_path, monkeypatch, lambda cfgs: [])
    (tmp_path / "file").write_text("")
    outs = [tmp_path / "models" / "seed0", tmp_path / "file" / "seed1"]
    with pytest.raises(UserError, match="cannot write the output directory .*file/seed1"):
        train_stage.run_group(params, "capsnet_r1", [0, 1], tmp_path / "data", outs, tmp_path / "c.pt")
    assert "extras" not in seen and not (tmp_path / "mlflow.db").exists()


def test_a_runs_mlflow_params_are_its_own_settings_and_its_steps_whole_batches_of_each_epoch():
    """run_params: each setting under its own key (every one here differs from the committed params and
    from the others), the device the run resolved to, not the one asked for, and the steps as epochs ×
    whole batches of the epoch's images (100 // 32 = 3 a epoch)."""
    import dataclasses

    from conftest import REPO
    from pipeline.core.params import load_params
    from pipeline.training.config import run_config
    from pipeline.training.train import count_params

    cfg = dataclasses.replace(run_config(load_params(REPO / "params.yaml"), "capsnet_r1", 3), lr=0.002,
                              lr_decay_rate=0.97, lr_decay_steps=1234, lr_schedule_epochs=640, epochs=5, batch_size=32,
                              device="auto", recipe="official", routing_iterations=2)
    data = {"train_images": torch.zeros(100, 28, 28, dtype=torch.uint8),
            "test_images": torch.zeros(7, 28, 28, dtype=torch.uint8)}
    assert train_stage.run_params(cfg, data, torch.device("cpu"), {"torch_version": "9.9"}) == {
        "variant": "capsnet_r1", "model": "capsnet", "routing_iterations": 2, "reconstruction": False, "seed": 3,
        "batch_size": 32, "lr": 0.002, "lr_decay_rate": 0.97, "lr_decay_steps": 1234, "lr_schedule_epochs": 640,
        "epochs": 5, "steps": 15, "amp": cfg.amp, "compile": cfg.compile, "n_params": count_params(cfg),
        "device": "cpu", "torch_version": "9.9", "profile": cfg.profile, "recipe": "official", "experiment": "table1",
        "image_size": 28, "n_train": 100, "n_test": 7}
