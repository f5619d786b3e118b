"""The training loop on tiny data: the loss falls, a killed run resumes to the uninterrupted one, a
non-finite loss stops it naming its step, checkpoints and early stopping; the CLI: tests/test_train_cli.py."""

import dataclasses
import math

import pytest
import torch

from conftest import REPO, Recorder, experiment_of, synthetic_digits, tiny_config, tiny_data

from pipeline.core.errors import UserError
from pipeline.core.params import load_params
from pipeline.experiments import affnist, table1
from pipeline.training import stack as stack_module
from pipeline.training import train as train_module
from pipeline.training.config import run_config
from pipeline.training.train import NonFiniteLossError, train


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


def test_early_stopping_stops_at_the_first_epoch_reaching_the_target(tmp_path, monkeypatch, capsys):
    """A constructed sequence of per-epoch test errors: accuracy 95 %, 99.22 %, 99.23 %, 99.5 %, ...; the
    log says when and why the seed stopped."""
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
    assert "capsnet_r1 seed0: test accuracy 99.23% reached the target 99.23% after epoch 3; early stop" \
        in capsys.readouterr().out
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


def test_a_captured_step_asked_for_on_a_cpu_runs_uncaptured_and_says_so(tmp_path):
    """train.cuda_graph on a CPU: the capturable step, run uncaptured (the same arithmetic), with one warning."""
    with pytest.warns(UserWarning, match="train.cuda_graph is on but the device is cpu: the capturable step runs "
                                         "uncaptured"):
        train(tiny_config(epochs=1, cuda_graph=True), tiny_data(n_train=16), tmp_path / "g.pt")
