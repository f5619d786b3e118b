"""Training loop, resume, NaN guard, MLflow tracking and the train/evaluate CLI on tiny data."""

import copy
import dataclasses
import json
import math

import pytest
import torch
import yaml
from click.testing import CliRunner

from conftest import REPO, Recorder, synthetic_digits, tiny_data, tiny_pipeline, with_ablation
from mlflow.tracking import MlflowClient


from pipeline.core import provenance, tracking
from pipeline.core.errors import UserError
from pipeline.core.params import load_params
from pipeline.data import splits
from pipeline.experiments import affnist, table1
from pipeline.report import runs as rr
from pipeline.training import stack as stack_module
from pipeline.training import train as train_module
from pipeline.training.config import RunConfig, run_config
from pipeline.training.train import NonFiniteLossError, train


def experiment_of(cfg, data, device):
    """What the training loop builds for ``cfg``: its experiment's Training."""
    return cfg.experiment_module().Training(cfg, data, device)


def tiny_config(**changes) -> RunConfig:
    cfg = RunConfig(variant="capsnet_r1", model="capsnet", routing_iterations=1, reconstruction=False,
                    image_size=28, num_classes=10, target_accuracy_pct=0.0, seed=0, profile="smoke", epochs=3, batch_size=16,
                    lr=1e-3, lr_decay_rate=0.96, lr_decay_steps=2000, lr_min=1e-6, max_shift=2, amp=False,
                    compile=False, deterministic=True, log_every=2, eval_batch_size=64, device="cpu")
    return dataclasses.replace(cfg, **changes)


def test_training_lowers_the_loss(tmp_path):
    result = train(tiny_config(epochs=4), tiny_data(), tmp_path / "ckpt.pt")
    losses = [h["train_loss"] for h in result.history]
    assert losses[-1] < losses[0]
    assert len(result.history) == 4 and result.steps == 4 * 3
    assert set(result.history[0]) >= {"train_loss", "margin_loss", "reconstruction_loss", "lr", "test_error_pct",
                                      "epoch_seconds", "train_images_per_second"}


def test_kill_and_resume_equals_uninterrupted(tmp_path):
    cfg, data = tiny_config(), tiny_data()
    straight = train(cfg, data, tmp_path / "a.pt")
    with pytest.raises(KeyboardInterrupt):
        train(cfg, data, tmp_path / "b.pt", logger=Recorder(stop_after=1))
    with pytest.raises(KeyboardInterrupt):  # killed a second time, after epoch 2
        train(cfg, data, tmp_path / "b.pt", logger=Recorder(stop_after=2))
    recorder = Recorder()
    resumed = train(cfg, data, tmp_path / "b.pt", logger=recorder)
    assert resumed.resumed_from_epoch == 2 and [e for e, _ in recorder.epochs] == [3]
    assert resumed.resumed_at == [1, 2]  # every resume, carried by the checkpoint across processes
    for key, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    assert [h["test_error_pct"] for h in straight.history] == [h["test_error_pct"] for h in resumed.history]
    assert [h["train_loss"] for h in straight.history] == [h["train_loss"] for h in resumed.history]
    # a finished run is not retrained
    again = Recorder()
    train(cfg, data, tmp_path / "b.pt", logger=again)
    assert again.epochs == []


def test_a_compressed_schedule_reaches_the_optimizer_and_the_checkpoint_digest(tmp_path):
    """lr_schedule_epochs compresses the decay: 2 epochs of 3 steps laid over 640 epochs' decay, so
    the logged lr after 6 steps is 1e-3 · 0.96^(6/2000 · 640/2); a checkpoint of the uncompressed
    configuration does not resume a compressed one."""
    result = train(tiny_config(epochs=2, lr_schedule_epochs=640), tiny_data(), tmp_path / "a.pt")
    assert result.history[-1]["lr"] == pytest.approx(1e-3 * 0.96 ** (6 / 2000 * 320))
    assert result.history[0]["lr"] == pytest.approx(1e-3 * 0.96 ** (3 / 2000 * 320))
    plain = train(tiny_config(epochs=2), tiny_data(), tmp_path / "b.pt")
    assert plain.history[-1]["lr"] == pytest.approx(1e-3 * 0.96 ** (6 / 2000))
    assert tiny_config(lr_schedule_epochs=640).digest() != tiny_config().digest()


# a checkpoint's key (RunConfig.digest) as the code before the experiment key (a9198fb^) computed it, for
# tiny_config (Table 1) and for a MultiMNIST run of 32 examples an epoch: checkpoints written then resume now
TABLE1_KEY, MULTIMNIST_KEY = "b7df9dd8b95c77b4", "2ccfe9b959a6d948"


def test_a_checkpoints_key_is_the_mathematics_alone_and_keys_written_before_its_new_fields_still_match():
    """Bookkeeping and speed levers leave the key alone; the experiment (once it is not the one the image
    size used to say), MultiMNIST's epoch size, TF32 and a compressed schedule change it; at their old
    values the key is the one written before those fields existed."""
    cfg = tiny_config(experiment="table1")
    for field, value in (("log_every", 7), ("eval_batch_size", 8), ("profile", "gpu"), ("checkpoint_every", 5),
                         ("channels_last", True), ("compile_mode", "max-autotune"), ("stack_layout", "loop"),
                         ("cuda_graph", True), ("multimnist_epoch_size", 32)):
        assert dataclasses.replace(cfg, **{field: value}).digest() == cfg.digest(), field
    assert cfg.digest() == TABLE1_KEY
    multimnist = tiny_config(experiment="multimnist", image_size=36, variant="capsnet_multimnist")
    assert dataclasses.replace(multimnist, multimnist_epoch_size=32).digest() == MULTIMNIST_KEY
    assert multimnist.digest() != MULTIMNIST_KEY
    assert tiny_config(experiment="affnist").digest() != cfg.digest()  # another experiment, the same size
    for field, value in (("tf32", True), ("lr_schedule_epochs", 640)):
        assert dataclasses.replace(cfg, **{field: value}).digest() != cfg.digest(), field


def test_a_run_config_takes_its_variant_s_settings_its_experiment_s_plan_the_profile_and_the_overrides():
    """run_config: §5.2's early stopping, MultiMNIST's ±4 px shift (its recipes', not train.max_shift's 2),
    params' profile name and the caller's overrides, last; a record without the experiment key is
    read by its image size."""
    params = load_params(REPO / "params.yaml")
    params = dataclasses.replace(params, base=dataclasses.replace(params.base, profile="gpu"))
    affnist_cfg, multimnist = run_config(params, "capsnet_affnist", 1), run_config(params, "multimnist_r1_recon", 0)
    assert (affnist_cfg.target_accuracy_pct, affnist_cfg.seed, affnist_cfg.profile) == (99.23, 1, "gpu")
    assert (multimnist.max_shift, run_config(params, "capsnet_r1", 0).max_shift) == (4, 2)
    assert run_config(params, "multimnist_r1_recon", 0, max_shift=1, epochs=7).max_shift == 1
    assert dataclasses.replace(multimnist, experiment="").experiment_name == "multimnist"


def test_checkpoint_of_another_config_is_not_resumed(tmp_path):
    train(tiny_config(epochs=1), tiny_data(), tmp_path / "c.pt")
    with pytest.warns(UserWarning, match="another configuration"):
        result = train(tiny_config(epochs=1, lr=5e-4), tiny_data(), tmp_path / "c.pt")
    assert result.resumed_from_epoch == 0


def test_non_finite_loss_names_the_step_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    real = stack_module.compute_loss
    calls = {"n": 0}

    def poisoned(model, x, y, capsnet, targets=None, keep=None):
        calls["n"] += 1
        loss, margin, recon = real(model, x, y, capsnet, targets, keep)
        return (loss * float("nan"), margin, recon) if calls["n"] == 5 else (loss, margin, recon)

    monkeypatch.setattr(stack_module, "compute_loss", poisoned)
    checkpoint = tmp_path / "d.pt"
    with pytest.raises(NonFiniteLossError, match="non-finite loss at step 4 "):
        train(tiny_config(), tiny_data(), checkpoint)
    assert torch.load(checkpoint, weights_only=False)["epoch"] == 0  # epoch 1 is kept


@pytest.mark.parametrize("damage", ["cut short", "a pickled object"])
def test_an_unreadable_checkpoint_is_moved_aside_and_training_starts_afresh(tmp_path, damage):
    """A checkpoint cut short (a full disk) or holding anything but tensors, numbers, strings, lists
    and dicts (read with weights_only=True: nothing in it runs) is moved aside with one warning,
    never deleted, and the run trains from the start."""
    import datetime

    checkpoint = tmp_path / "c.pt"
    train(tiny_config(epochs=1), tiny_data(), checkpoint)
    good = checkpoint.read_bytes()
    assert torch.load(checkpoint, weights_only=True)["epoch"] == 0  # what training writes loads safely
    if damage == "cut short":
        checkpoint.write_bytes(good[: len(good) // 2])
    else:  # an object unpickling would build (and could run code for): not a tensor, number, string, list or dict
        torch.save({"digest": datetime.datetime(2026, 1, 1)}, checkpoint)
    bad = checkpoint.read_bytes()
    with pytest.warns(UserWarning, match=r"checkpoint .*c\.pt is unreadable .*moved aside to .*training starts afresh"):
        result = train(tiny_config(epochs=1), tiny_data(), checkpoint)
    [aside] = tmp_path.glob("c.pt.unreadable-*")
    assert aside.read_bytes() == bad and result.resumed_from_epoch == 0 and len(result.history) == 1
    assert torch.load(checkpoint, weights_only=True)["epoch"] == 0  # a fresh one in its place


def test_a_sigterm_while_a_checkpoint_is_read_stops_the_run_and_leaves_the_checkpoint_in_place(tmp_path, monkeypatch):
    """Terminated (SIGTERM, pipeline.stages.train) is no Exception: the unreadable-checkpoint guard, which
    catches every Exception, lets it through instead of moving a good checkpoint aside and starting afresh."""
    from pipeline.core.errors import Terminated
    from pipeline.training import checkpoint as checkpoint_module

    checkpoint = tmp_path / "c.pt"
    train(tiny_config(epochs=1), tiny_data(), checkpoint)

    def stopped(*args, **kwargs):
        raise Terminated("stopped by signal 15")

    monkeypatch.setattr(checkpoint_module.torch, "load", stopped)
    with pytest.raises(Terminated):
        checkpoint_module.load_checkpoint(checkpoint, tiny_config(epochs=1))
    assert checkpoint.is_file() and not list(tmp_path.glob("c.pt.unreadable-*"))


def test_early_stopping_stops_at_the_first_epoch_reaching_the_target(tmp_path, monkeypatch):
    """A constructed sequence of per-epoch test errors: accuracy 95 %, 99.22 %, 99.23 %, 99.5 %, ..."""
    data = tiny_data()
    n_test = 10_000
    data["test_images"] = torch.zeros(n_test, 28, 28, dtype=torch.uint8)
    data["test_labels"] = torch.zeros(n_test, dtype=torch.uint8)
    errors = iter([500, 78, 77, 50, 40])  # wrong predictions per epoch

    def constructed_predict(model, images, batch_size, amp=False):
        preds = torch.zeros(images.shape[0], dtype=torch.long)
        preds[:next(errors)] = 1
        return torch.zeros(images.shape[0], 10), preds

    monkeypatch.setattr(table1, "predict", constructed_predict)
    cfg = tiny_config(epochs=5, target_accuracy_pct=99.23)
    result = train(cfg, data, tmp_path / "e.pt")
    assert result.stop_reason == "target" and len(result.history) == 3 and result.steps == 3 * 3
    assert [h["test_error_pct"] for h in result.history] == pytest.approx([5.0, 0.78, 0.77])
    assert torch.load(tmp_path / "e.pt", weights_only=False)["seeds"][0]["stop_reason"] == "target"
    again = Recorder()  # an early-stopped run is finished: re-running trains nothing
    rerun = train(cfg, data, tmp_path / "e.pt", logger=again)
    assert again.epochs == [] and rerun.stop_reason == "target" and len(rerun.history) == 3


def test_without_a_target_every_epoch_runs(tmp_path):
    result = train(tiny_config(epochs=2), tiny_data(), tmp_path / "f.pt")
    assert result.stop_reason == "budget" and len(result.history) == 2


def test_each_variant_builds_the_model_its_params_name_with_its_routing_reconstruction_and_recipe():
    from pipeline.models.capsnet import CapsNetConfig

    params = load_params(REPO / "params.yaml")
    classes = {"capsnet": "CapsNet", "pooling_cnn": "PoolingCNN", "multimnist_cnn": "MultiMNISTCNN",
               "baseline_cnn": "BaselineCNN"}
    assert {v.model for v in params.variants.values()} == classes.keys()
    for variant in params.variants:
        cfg = run_config(params, variant, 0)
        with torch.device("meta"):
            model = train_module.build_model(cfg)
        assert type(model).__name__ == classes[cfg.model], variant
        if cfg.model == "capsnet":
            assert model.config == CapsNetConfig(cfg.routing_iterations, cfg.reconstruction, cfg.image_size,
                                                 cfg.num_classes, cfg.recipe), variant


def test_amp_on_a_cpu_says_so_and_trains_in_fp32(tmp_path):
    """train.amp is bf16 autocast on CUDA only: on a CPU the run warns and trains what fp32 trains."""
    cfg, data = tiny_config(epochs=1, amp=True), tiny_data(n_train=32)
    with pytest.warns(UserWarning, match="train.amp is on but the device is not CUDA: training in fp32"):
        mine = train(cfg, data, tmp_path / "amp.pt")
    theirs = train(dataclasses.replace(cfg, amp=False), data, tmp_path / "fp32.pt")
    for name, value in theirs.model.state_dict().items():
        assert torch.equal(mine.model.state_dict()[name], value), name


def test_a_batch_larger_than_an_epoch_is_one_line_before_any_step(tmp_path):
    with pytest.raises(UserError, match=r"^train.batch_size 64 exceeds the 32 training examples of an epoch$"):
        train(tiny_config(batch_size=64), tiny_data(n_train=32), tmp_path / "c.pt")
    assert not (tmp_path / "c.pt").exists()


def test_each_seed_of_a_group_keeps_its_extras_counts_its_own_images_and_says_it_trained_stacked(tmp_path, capsys):
    """A group's checkpoint carries each seed's extras (its tracking run id: a resume logs on into
    it); each seed's images/s counts its own images, not the group's; its epoch line says it was stacked."""
    cfgs = [tiny_config(epochs=1, seed=s) for s in (0, 1)]
    results = train_module.train_group(cfgs, tiny_data(n_train=32), tmp_path / "g.pt",
                                       extras=[{"run_id": "a"}, {"run_id": "b"}])
    state = torch.load(tmp_path / "g.pt", weights_only=False)
    assert [s["extra"] for s in state["seeds"]] == [{"run_id": "a"}, {"run_id": "b"}]
    for result in results:
        [epoch] = result.history
        assert epoch["train_images_per_second"] * epoch["epoch_seconds"] == pytest.approx(2 * 16)
    lines = [line for line in capsys.readouterr().out.splitlines() if " epoch 1/1: " in line]
    assert [line.split(" epoch")[0] for line in lines] == ["capsnet_r1 seed0", "capsnet_r1 seed1"]
    assert all(line.endswith(" img/s (2 seeds stacked)") for line in lines)


class StepSpy:
    """The step `make_step` built, noting each step's (S, 3) loss parts (total, margin, reconstruction)
    as the step adds them to the epoch's sums; everything else is the step's own."""

    def __init__(self, step):
        self.step, self.parts = step, []

    def __call__(self):
        before = self.step.sums.clone()
        self.step()
        self.parts.append(self.step.sums - before)

    def __getattr__(self, name):
        return getattr(self.step, name)


def test_an_epochs_losses_are_each_seeds_mean_over_its_steps_each_in_its_column(tmp_path, monkeypatch):
    """A seed's history reads its train, margin and reconstruction losses as the means over the epoch's
    steps of what each step computed for that seed: not their sum, which grows with the epoch's length."""
    spies = []
    make_step = train_module.make_step
    monkeypatch.setattr(train_module, "make_step", lambda *args: spies.append(StepSpy(make_step(*args))) or spies[-1])
    cfgs = [tiny_config(epochs=1, seed=s, reconstruction=True) for s in (0, 1)]
    results = train_module.train_group(cfgs, tiny_data(n_train=48), tmp_path / "g.pt")
    [spy] = spies
    assert len(spy.parts) == 3
    means = torch.stack(spy.parts).mean(0)  # (S, 3)
    for k, result in enumerate(results):
        [epoch] = result.history
        assert [epoch[c] for c in ("train_loss", "margin_loss", "reconstruction_loss")] == pytest.approx(
            means[k].tolist(), rel=1e-6)


def test_a_non_finite_loss_in_a_group_names_the_seed_it_came_from_at_the_next_read(tmp_path, monkeypatch):
    """The loop reads the tallies every log_every steps: a NaN total of seed 1 at the first of an
    epoch's two steps stops the group after that step, naming seed 1."""
    real, steps_run = stack_module.SeedStack.forward, []
    seed1 = torch.tensor([[False] * 3, [True, False, False]])  # seed 1's total

    def forward(self, batch, keep):
        steps_run.append(1)
        return torch.where(seed1, float("nan"), real(self, batch, keep))

    monkeypatch.setattr(stack_module.SeedStack, "forward", forward)
    with pytest.raises(NonFiniteLossError, match=r"^capsnet_r1 seed 1: non-finite loss at step 0 \(epoch 1\)"):
        train_module.train_group([tiny_config(epochs=1, seed=s, log_every=1) for s in (0, 1)], tiny_data(n_train=32),
                                 tmp_path / "g.pt")
    assert len(steps_run) == 1


def test_the_device_auto_is_cuda_where_torch_sees_one_and_a_cuda_device_torch_cannot_see_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert train_module.resolve_device("auto") == torch.device("cuda")
    assert train_module.resolve_device("cuda:1") == torch.device("cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert train_module.resolve_device("auto") == torch.device("cpu")
    with pytest.raises(UserError, match=r"train.device is 'cuda:1' but torch .* sees no CUDA device; set train.device"):
        train_module.resolve_device("cuda:1")


@pytest.mark.parametrize("accuracy,target,reached", [(99.23, 99.23, True), (99.22, 99.23, False),
                                                     (100.0, 0.0, False), (50.0, 40.0, True)])
def test_target_reached(accuracy, target, reached):
    assert train_module.target_reached(100.0 - accuracy, target) is reached


def test_the_experiment_shifts_at_28_and_places_on_the_canvas_at_40():
    images, _ = synthetic_digits(8)
    g = torch.Generator().manual_seed(0)
    mnist = experiment_of(tiny_config(), tiny_data(), torch.device("cpu"))
    canvas = experiment_of(tiny_config(image_size=40), tiny_data(), torch.device("cpu"))
    assert type(mnist) is table1.Training and type(canvas) is affnist.Training
    shifted = mnist.augment(images, g)
    assert shifted.shape == (8, 28, 28) and not torch.equal(shifted, images)
    placed = canvas.augment(images, g)
    assert placed.shape == (8, 40, 40)
    assert torch.equal(placed.flatten(1).long().sum(1), images.flatten(1).long().sum(1))  # whole digits, no shift loss


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
    from conftest import REPO

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


def test_checkpoint_every_saves_every_kth_and_the_last_epoch(tmp_path):
    cfg, data = tiny_config(epochs=3, checkpoint_every=2), tiny_data()
    with pytest.raises(KeyboardInterrupt):
        train(cfg, data, tmp_path / "k.pt", logger=Recorder(stop_after=1))
    assert not (tmp_path / "k.pt").exists()  # epoch 1 is not a checkpoint epoch
    with pytest.raises(KeyboardInterrupt):
        train(cfg, data, tmp_path / "k.pt", logger=Recorder(stop_after=3))  # killed after epoch 3's save
    assert torch.load(tmp_path / "k.pt", weights_only=False)["epoch"] == 2  # the last epoch (index 2) is saved
    assert cfg.digest() == tiny_config(epochs=3).digest()  # how often it saves does not change the run


@pytest.mark.parametrize("recipe", ["paper", "official"])
def test_both_recipes_train_a_few_steps_with_finite_loss(tmp_path, recipe):
    cfg = tiny_config(epochs=2, reconstruction=True, recipe=recipe)
    result = train(cfg, tiny_data(), tmp_path / "c.pt")
    assert len(result.history) == 2
    for h in result.history:
        assert all(math.isfinite(h[k]) for k in ("train_loss", "margin_loss", "reconstruction_loss"))
        assert h["reconstruction_loss"] > 0
    assert cfg.digest() != tiny_config(epochs=2, reconstruction=True, recipe="other").digest()
    assert train_module.count_params(cfg) == (8_215_728 if recipe == "official" else 8_215_568)


NHWC_CPU_BOUND = 1e-2  # per parameter, relative to float64; see the test's docstring


@pytest.mark.parametrize("variant", ["baseline_cnn", "capsnet_r3_recon", "cnn_affnist", "multimnist_baseline",
                                     "multimnist_r3_recon"])
def test_channels_last_step_computes_the_same_step(variant):
    """train.channels_last changes the memory layout, not the step: from the same weights and batch
    the loss and every parameter's gradient match a float64 step, with the conv weights really in NHWC.

    Measured on this project's CPU (oneDNN, AVX2, fp32): the NCHW step is within 2.5e-6 of float64
    everywhere, but oneDNN's NHWC weight-gradient kernels accumulate less exactly: multimnist_baseline's
    conv1.weight gradient is 3.4e-3 off (conv2 9e-4), the other models' under 1e-4. Hence the looser
    NHWC_CPU_BOUND for NHWC; on CUDA tests/test_gpu.py compares cuDNN's NHWC step with eager fp32."""
    from pipeline.experiments import multimnist as mm
    from pipeline.core.params import load_params

    cfg = run_config(load_params(REPO / "params.yaml"), variant, 0, device="cpu", batch_size=8)
    images, labels = synthetic_digits(8, seed=4)
    generator = torch.Generator().manual_seed(0)
    targets = None
    if cfg.experiment_name == "multimnist":
        pairs, shifts = mm.sample_pairs(mm.class_index(labels), 8, cfg.max_shift, generator)
        merged, digits = mm.compose(images, pairs, shifts)
        x, y, targets = train_module.to_float(merged), labels.long()[pairs], digits.unsqueeze(2).float() / 255
    else:
        x = train_module.to_float(experiment_of(cfg, tiny_data(), torch.device("cpu")).augment(images, generator))
        y = labels.long()
    torch.manual_seed(0)
    model = train_module.build_model(cfg).eval()  # eval: the CNNs' dropout off, so no step draws masks

    def step(channels_last: bool, dtype: torch.dtype) -> tuple[float, dict[str, torch.Tensor]]:
        placed = train_module.place_model(copy.deepcopy(model).to(dtype),
                                          dataclasses.replace(cfg, channels_last=channels_last), torch.device("cpu"))
        convs = [p for p in placed.parameters() if p.dim() == 4 and p.shape[1] > 1]  # one in-channel: both layouts
        assert convs and all(p.is_contiguous(memory_format=torch.channels_last) == channels_last for p in convs)
        loss, _, _ = train_module.compute_loss(placed, x.to(dtype), y, train_module.loss_recipe(cfg),
                                               None if targets is None else targets.to(dtype))
        loss.backward()
        return loss.item(), {name: p.grad.double() for name, p in placed.named_parameters()}

    exact_loss, exact = step(False, torch.float64)
    for channels_last, bound in ((False, 1e-4), (True, NHWC_CPU_BOUND)):
        loss, grads = step(channels_last, torch.float32)
        assert loss == pytest.approx(exact_loss, rel=1e-5)
        worst = max((float((grads[n] - g).norm() / g.norm()), n) for n, g in exact.items() if g.norm() > 0)
        assert worst[0] < bound, f"channels_last={channels_last}: {worst[1]} gradient {worst[0]:.2e} off float64"
    assert cfg.digest() == dataclasses.replace(cfg, channels_last=True).digest()  # a layout, not another run


def test_a_channels_last_run_trains_and_saves_like_the_default(tmp_path):
    data = tiny_data()
    plain = train(tiny_config(epochs=1), data, tmp_path / "a.pt")
    nhwc = train(tiny_config(epochs=1, channels_last=True), data, tmp_path / "b.pt")
    assert nhwc.history[0]["train_loss"] == pytest.approx(plain.history[0]["train_loss"], rel=1e-4)
    for name, weight in nhwc.model.state_dict().items():  # Adam's normalised steps: compare norms, not elements
        expected = plain.model.state_dict()[name]
        assert float((weight - expected).norm() / expected.norm()) < 1e-4, name  # measured ≤ 1.4e-5 (3 steps)
    assert nhwc.model.primary.conv.weight.is_contiguous(memory_format=torch.channels_last)


def test_the_compile_mode_reaches_torch_compile_and_is_not_part_of_the_checkpoint_key(tmp_path, monkeypatch):
    modes = []

    def compile_spy(module, mode="default"):  # records the mode and trains eagerly
        modes.append(mode)
        return module

    monkeypatch.setattr(train_module.torch, "compile", compile_spy)
    cfg = tiny_config(epochs=1, compile=True, compile_mode="max-autotune-no-cudagraphs")
    train(cfg, tiny_data(), tmp_path / "c.pt")
    assert modes == ["max-autotune-no-cudagraphs"]
    assert cfg.digest() == dataclasses.replace(cfg, compile_mode="reduce-overhead").digest()  # a speed lever
