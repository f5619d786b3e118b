"""Stacked seeds (pipeline.training.stack, train.train_group): S seeds trained as one computation give each
seed what a separate run of it gives, for every experiment family and a CNN with dropout, in every
layout (fused, bmm, loop, streams) and compiled. A group's seeds apart (one stopping early, a killed
group resuming, the group's checkpoint key): tests/test_stack_group.py."""

import contextlib
import dataclasses

import pytest
import torch

from conftest import synthetic_digits, tiny_data
from stacks import (BMM_WEIGHT_RTOL, MULTIMNIST_WEIGHT_RTOL, SEEDS, WEIGHT_RTOL, assert_close_in_norm,
                    assert_same_run, config, data_for)
from pipeline.experiments import multimnist as mm
from pipeline.training.train import predict, train, train_group


@pytest.mark.parametrize("variant", ["capsnet_r3_recon", "baseline_cnn", "cnn_affnist", "multimnist_r1_recon"])
def test_stacked_seeds_train_as_separate_runs(variant, tmp_path, small_cnns):
    """capsnet_r3_recon: a CapsNet with reconstruction; baseline_cnn: a CNN with dropout;
    cnn_affnist: §5.2's canvas (and dropout); multimnist_r1_recon: pairs with two reconstructions."""
    # 2 steps an epoch, 2 epochs; the CapsNets (seconds a step on 2 cores) on half the images
    small = variant.startswith(("capsnet", "multimnist_r"))
    cfg = config(variant, batch_size=12, multimnist_epoch_size=24) if small else config(variant)
    data = data_for(cfg, n_train=24 if small else 48)
    cfgs = [dataclasses.replace(cfg, seed=s) for s in SEEDS]
    stacked = train_group(cfgs, data, tmp_path / "stack.pt")
    for k, c in enumerate(cfgs):
        separate = train(c, data, tmp_path / f"seed{c.seed}.pt")
        bound = MULTIMNIST_WEIGHT_RTOL if cfg.experiment_name == "multimnist" else WEIGHT_RTOL
        assert_same_run(stacked[k], separate, f"{variant} seed {c.seed}", bound)
        images = data["test_images"][:16] if cfg.experiment_name != "multimnist" else mm.compose(
            data["test_images"], data["test_pairs"][:16], data["test_shifts"][:16])[0]
        (mine, mine_pred), (theirs, their_pred) = predict(stacked[k].model, images, 64), predict(separate.model, images, 64)
        assert torch.equal(mine_pred, their_pred)
        # scores go through routing's squashes, which magnify the weights' 1e-6 differences ~10×
        assert_close_in_norm(mine, theirs, f"{variant} seed {c.seed} test scores", bound=1e-4)
    # the seeds really differ: their own initialisation and streams
    assert not torch.equal(next(iter(stacked[0].model.parameters())), next(iter(stacked[1].model.parameters())))


def test_a_cnns_loss_is_its_margin_or_cross_entropy_in_fp32_and_lossof_scores_multimnist_on_its_targets():
    """A CNN's loss (no reconstruction: 0) is MultiMNIST's margin loss with both classes present, else
    cross-entropy, on its scores in fp32 even where autocast gave them in bf16; `LossOf` (the gradient
    checks, the bench) scores a MultiMNIST CapsNet's reconstructions against each digit alone."""
    from pipeline.models.capsnet import CapsNet, margin_loss
    from pipeline.training.stack import LossOf, compute_loss

    torch.manual_seed(0)
    linear, x = torch.nn.Linear(16, 10), torch.randn(4, 1, 4, 4)
    cnn = lambda images: linear(images.flatten(1))  # noqa: E731
    pairs, labels = torch.tensor([[1, 2], [3, 4], [0, 9], [5, 7]]), torch.tensor([1, 3, 0, 5])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        total, margin, reconstruction = compute_loss(cnn, x, pairs, None)
        scores = cnn(x)
    assert scores.dtype == torch.bfloat16 and total.dtype == torch.float32
    assert torch.equal(total, margin_loss(scores.float(), pairs)) and torch.equal(margin, total)
    assert float(reconstruction) == 0.0
    assert torch.equal(compute_loss(cnn, x, labels, None)[0], torch.nn.functional.cross_entropy(cnn(x), labels))
    model, images = CapsNet(1, True, 36, 10, "paper"), torch.rand(2, 1, 36, 36)
    targets, pairs = torch.rand(2, 2, 1, 36, 36), torch.tensor([[1, 2], [3, 4]])
    theirs = compute_loss(model, images, pairs, "paper", targets)
    mine = LossOf(model, "paper")(images, pairs, targets)
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs))
    assert not torch.equal(mine[2], compute_loss(model, images, pairs, "paper")[2])  # the input is not each digit


def test_loss_function_compiles_in_the_mode_it_is_given_only_under_train_compile(monkeypatch):
    """`loss_function` (the CUDA tests' single model): torch.compile in ``compile_mode`` where cfg.compile
    says so, else the `LossOf` module itself."""
    from pipeline.training.stack import LossOf, loss_function

    modes = []
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None: modes.append(mode) or ("compiled", fn))
    model = torch.nn.Linear(2, 2)
    plain = loss_function(model, dataclasses.replace(config("baseline_cnn"), compile=False), "max-autotune")
    assert isinstance(plain, LossOf) and plain.model is model and plain.recipe is None and modes == []
    tag, fn = loss_function(model, dataclasses.replace(config("capsnet_r1"), compile=True), "max-autotune")
    assert tag == "compiled" and fn.model is model and fn.recipe == "paper" and modes == ["max-autotune"]


def test_compiled_compiles_the_whole_stack_in_its_mode_or_in_the_streams_layout_each_seeds_loss(monkeypatch):
    """train.compile: one graph of the whole stack, in train.compile_mode; in the streams layout of
    several seeds, each seed's loss compiled (a graph launches on one stream) and the stack itself run."""
    from pipeline.training.stack import SeedStack, compiled

    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None: calls.append((fn, mode)) or "compiled")
    models = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]
    fused = SeedStack(models, None, "fused")
    assert compiled(fused, "reduce-overhead") == "compiled" and calls == [(fused, "reduce-overhead")]
    streams = SeedStack(models, None, "streams")
    assert compiled(streams, "max-autotune") is streams and streams.compiled_one == "compiled"
    assert calls[1] == (streams._one, "max-autotune")
    alone = SeedStack(models[:1], None, "streams")  # one seed has no streams to keep apart
    assert compiled(alone) == "compiled" and calls[2] == (alone, "default")


@pytest.mark.parametrize("conv", [
    torch.nn.Conv2d(1, 16, 9),  # CapsNet's conv1 (256 channels in the paper)
    torch.nn.Conv2d(16, 32, 9, stride=2),  # PrimaryCaps (256 -> 256 in the paper)
    torch.nn.Conv2d(8, 8, 5, padding=2),  # the CNNs' 5×5 SAME convolutions
    torch.nn.Conv2d(8, 4, 5, padding=2, bias=False),
    torch.nn.Conv2d(4, 4, (3, 5), stride=(1, 2), padding=(2, 1), dilation=2),  # no model's: every term of H', W'
])
def test_a_convolution_as_a_matrix_product_computes_the_convolution(conv):
    """`conv2d_as_matmul` (the bmm layout) against conv2d: outputs and both gradients within 1e-5 in
    relative norm (the same sums in another order)."""
    from pipeline.training.stack import conv2d_as_matmul

    torch.manual_seed(0)
    x = torch.randn(3, conv.in_channels, 28, 28, requires_grad=True)
    mine, theirs = conv2d_as_matmul(conv, x), conv(x)
    assert mine.shape == theirs.shape
    assert_close_in_norm(mine, theirs, f"{conv} output")
    for a, b, what in zip(torch.autograd.grad(mine.square().sum(), [x, conv.weight]),
                          torch.autograd.grad(theirs.square().sum(), [x, conv.weight]), ("input", "weight")):
        assert_close_in_norm(a, b, f"{conv} {what} gradient")


@pytest.mark.parametrize("conv", [torch.nn.Conv2d(4, 4, 3, groups=2),
                                  torch.nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect"),
                                  torch.nn.Conv2d(4, 4, 3, padding="same")])
def test_a_convolution_the_matrix_product_cannot_compute_is_refused(conv):
    """Grouped, not zero-padded, or padded by name: `conv2d_as_matmul` computes none of these."""
    from pipeline.training.stack import conv2d_as_matmul

    with pytest.raises(ValueError, match="ungrouped, zero-padded convolutions with numeric padding"):
        conv2d_as_matmul(conv, torch.randn(1, 4, 8, 8))


def test_a_stack_refuses_an_unknown_layout_buffers_and_dropout_it_cannot_reproduce():
    """`SeedStack` stacks parameters only, so a model with buffers (a batch norm's running statistics)
    is refused; so is dropout without ``dropout_keep`` (its masks would come from the global generator)
    and a layout that is not one of train.stack_layout's."""
    from pipeline.training.stack import SeedStack

    linear = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"layout must be one of .*'fused'.*, got 'diagonal'"):
        SeedStack([linear], None, "diagonal")
    with pytest.raises(ValueError, match="stacks parameters only; these models have buffers"):
        SeedStack([torch.nn.BatchNorm1d(2)], None)
    with pytest.raises(ValueError, match="Sequential has dropout but no dropout_keep"):
        SeedStack([torch.nn.Sequential(linear, torch.nn.Dropout(0.5))], None)


def test_the_loop_layout_runs_each_seeds_model_in_turn_and_the_fused_one_vmaps_them(monkeypatch):
    """"loop": each seed's own kernels, one after another (what a separate run computes, exactly);
    "fused": one vmapped computation of every seed; one seed is the loop of one, whatever the layout."""
    from pipeline.training import stack as stack_module
    from pipeline.training.experiment import Batch

    mapped = []
    real = stack_module.vmap
    monkeypatch.setattr(stack_module, "vmap", lambda fn, in_dims: mapped.append(in_dims) or real(fn, in_dims))
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3)) for _ in range(2)]
    batch = Batch(torch.rand(2, 5, 1, 2, 2), torch.randint(0, 3, (2, 5)), None)
    parts = stack_module.SeedStack(models, None, "loop")(batch, None)
    assert mapped == []
    for k, model in enumerate(models):
        assert torch.equal(parts[k], torch.stack(stack_module.compute_loss(model, batch.x[k], batch.labels[k], None)))
    stack_module.SeedStack(models, None, "fused")(batch, None)
    assert mapped == [(0, 0, 0, None, None)]
    alone = stack_module.SeedStack(models[:1], None, "streams")  # one seed: the loop of one, no streams
    alone(Batch(batch.x[:1], batch.labels[:1], None), None)
    assert alone.seed_streams is None and len(mapped) == 1


def test_a_one_seed_stack_holds_its_models_own_weights_and_several_seeds_stack_copies_of_theirs():
    """S = 1 is a separate run: its stacked weight is a view of the model's own parameter (its memory
    layout, channels_last included, and no copy); S seeds' weights are stacked in seed order."""
    from pipeline.training.stack import SeedStack

    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    weight, _ = SeedStack([first], None).weights
    assert weight.shape == (1, 2, 2) and weight.data_ptr() == first.weight.data_ptr()
    weight, _ = SeedStack([first, second], None).weights
    assert torch.equal(weight[0], first.weight) and torch.equal(weight[1], second.weight)
    assert weight.data_ptr() != first.weight.data_ptr()


def test_one_seeds_batch_is_a_view_of_its_own_and_several_are_stacked_on_a_leading_axis():
    """`stack_batches`: a separate run's batch gains its seed axis as a view (no per-step copy); S
    seeds' are stacked, a field that is None staying None."""
    from pipeline.training.experiment import Batch
    from pipeline.training.stack import stack_batches

    one = Batch(torch.rand(4, 1, 2, 2), torch.arange(4), None)
    alone = stack_batches([one])
    assert alone.x.shape == (1, 4, 1, 2, 2) and alone.x.data_ptr() == one.x.data_ptr() and alone.targets is None
    two = stack_batches([one, Batch(torch.rand(4, 1, 2, 2), torch.arange(4) + 1, None)])
    assert two.labels.tolist() == [[0, 1, 2, 3], [1, 2, 3, 4]] and two.targets is None


@pytest.mark.parametrize("variant", ["capsnet_r3_recon", "baseline_cnn"])
def test_the_bmm_layout_trains_as_separate_runs(variant, tmp_path, small_cnns, monkeypatch):
    """train.stack_layout: bmm (every convolution a batched matrix product over the seeds) gives
    each seed its separate run, as the fused layout does."""
    from pipeline.training import stack

    entered = []
    as_matmul = stack.conv2d_as_matmul
    monkeypatch.setattr(stack, "conv2d_as_matmul", lambda conv, x: entered.append(1) or as_matmul(conv, x))
    small = variant.startswith("capsnet")
    cfg = config(variant, batch_size=12, stack_layout="bmm") if small else config(variant, stack_layout="bmm")
    data = data_for(cfg, n_train=24 if small else 48)
    cfgs = [dataclasses.replace(cfg, seed=s) for s in SEEDS[:2]]
    stacked = train_group(cfgs, data, tmp_path / "stack.pt")
    n_convs = sum(isinstance(m, torch.nn.Conv2d) for m in stacked[0].model.modules())
    assert len(entered) == 4 * n_convs  # every step of the stack took the bmm path: 2 epochs of 2 steps
    for k, c in enumerate(cfgs):
        assert_same_run(stacked[k], train(dataclasses.replace(c, stack_layout="fused"), data, tmp_path / f"{k}.pt"),
                        f"{variant} seed {c.seed}", BMM_WEIGHT_RTOL)


@pytest.mark.parametrize("variant", ["capsnet_r3_recon", "baseline_cnn", "multimnist_r1_recon"])
def test_the_streams_layout_trains_each_seed_bit_for_bit_as_its_separate_run(variant, tmp_path, small_cnns):
    """train.stack_layout: streams runs each seed's own kernels (on a CUDA stream of its own, none
    on a CPU), so a seed's weights and history are its separate run's exactly: a CapsNet, a CNN's
    per-seed dropout masks, MultiMNIST's two-digit targets."""
    small = variant.startswith(("capsnet", "multimnist_r"))
    cfg = config(variant, batch_size=12, multimnist_epoch_size=24, stack_layout="streams") if small \
        else config(variant, stack_layout="streams")
    data = data_for(cfg, n_train=24 if small else 48)
    cfgs = [dataclasses.replace(cfg, seed=s) for s in SEEDS[:2]]
    stacked = train_group(cfgs, data, tmp_path / "stack.pt")
    for k, c in enumerate(cfgs):
        separate = train(dataclasses.replace(c, stack_layout="fused"), data, tmp_path / f"{k}.pt")
        for name, value in separate.model.state_dict().items():
            assert torch.equal(stacked[k].model.state_dict()[name], value), (variant, c.seed, name)
        for key in ("train_loss", "margin_loss", "reconstruction_loss", "test_error_pct"):
            assert [h[key] for h in stacked[k].history] == [h[key] for h in separate.history], (variant, c.seed, key)


class RecordedStreams:
    """A stand-in for `stack.SeedStreams` on the CPU: what a CUDA run would queue on which stream, in order."""

    events: list = []

    def __init__(self, device, n):
        self.device, self.inside = device, None

    def fork(self):
        self.events.append("fork")
        return "current"

    @contextlib.contextmanager
    def on(self, k):
        self.inside = k
        yield
        self.inside = None

    def join(self, current):
        self.events.append(f"join {current}")


def test_the_streams_layout_forks_every_seed_before_any_works_and_joins_them_after(monkeypatch):
    """Each seed's loss is computed inside its own stream's context (compiled too: `compiled` compiles
    the one-seed loss the streams forward calls, not the stack); the seeds' streams are forked from
    the current stream before any seed's work and joined back after all of it, so no seed waits for
    another and the step's result is on the current stream."""
    from pipeline.models.capsnet import CapsNet
    from pipeline.training import stack as stack_mod
    from pipeline.training.experiment import Batch

    monkeypatch.setattr(stack_mod, "SeedStreams", RecordedStreams)
    RecordedStreams.events = []
    models = []
    for s in SEEDS:
        torch.manual_seed(s)
        models.append(CapsNet(1, False, 28, 10))
    stack = stack_mod.SeedStack(models, "paper", "streams")
    compiled_fns = []
    monkeypatch.setattr(stack_mod.torch, "compile", lambda fn, mode="default": compiled_fns.append((fn, mode)) or fn)
    assert stack_mod.compiled(stack, "max-autotune") is stack  # the stack itself: each seed's loss is what compiles
    assert [(getattr(fn, "__func__", None), mode) for fn, mode in compiled_fns] == [(stack_mod.SeedStack._one, "max-autotune")]
    one = stack.compiled_one

    def seed_loss(weights, x, *rest):
        k = next(k for k in range(len(SEEDS)) if weights["conv1.weight"].data_ptr() == stack.weights[0][k].data_ptr())
        RecordedStreams.events.append(f"seed {k} on {stack.seed_streams.inside}")
        return one(weights, x, *rest)

    stack.__dict__["compiled_one"] = seed_loss
    images, labels = synthetic_digits(4 * len(SEEDS))
    x, y = images.unsqueeze(1).float() / 255, labels.long()
    batches = [Batch(x[4 * k:4 * k + 4], y[4 * k:4 * k + 4], None) for k in range(len(SEEDS))]
    stack(stack_mod.stack_batches(batches), None)
    assert RecordedStreams.events == ["fork", "seed 0 on 0", "seed 1 on 1", "seed 2 on 2", "join current"]
    # other layouts compile the stack as one graph
    compiled_fns.clear()
    fused = stack_mod.SeedStack(models, "paper", "fused")
    assert stack_mod.compiled(fused) is fused and compiled_fns == [(fused, "default")]


@pytest.mark.parametrize("layout", ["fused", "bmm", "loop", "streams"])
def test_the_stacked_loss_sums_the_seeds_so_each_gets_its_own_gradient(layout, monkeypatch):
    """Adam sees each seed's own gradient only if the loop backpropagates the sum: the stack's
    per-seed losses, differentiated, give each slice its separate model's gradient on that seed's
    own batch, in every layout (`bench --stack`); the bmm layout runs no convolution kernel."""
    from pipeline.models.capsnet import CapsNet
    from pipeline.training.experiment import Batch
    from pipeline.training.stack import SeedStack, compute_loss, stack_batches

    models = []
    for s in SEEDS:
        torch.manual_seed(s)
        models.append(CapsNet(1, True, 28, 10))
    images, labels = synthetic_digits(4 * len(SEEDS))
    x, y = images.unsqueeze(1).float() / 255, labels.long()
    batches = [Batch(x[4 * k:4 * k + 4], y[4 * k:4 * k + 4], None) for k in range(len(SEEDS))]
    stack = SeedStack([m for m in models], "paper", layout)
    convolutions = []
    conv2d = torch.nn.functional.conv2d
    monkeypatch.setattr(torch.nn.functional, "conv2d", lambda *a, **k: convolutions.append(1) or conv2d(*a, **k))
    parts = stack(stack_batches(batches), None)  # (S, 3)
    monkeypatch.undo()
    assert (len(convolutions) == 0) == (layout == "bmm")
    parts[:, 0].sum().backward()
    for k, (m, batch) in enumerate(zip(models, batches)):
        alone = compute_loss(m, batch.x, batch.labels, "paper")[0]
        torch.testing.assert_close(parts[k, 0], alone.detach(), rtol=1e-5, atol=1e-7)
        alone.backward()
        for w, (name, p) in zip(stack.weights, m.named_parameters()):
            torch.testing.assert_close(w.grad[k], p.grad, rtol=1e-5, atol=1e-8, msg=name)


def test_adam_sees_each_seeds_own_gradient_in_the_stack(tmp_path):
    """Summed, not averaged: after one epoch, the stack's Adam moments for seed k are those of seed
    k's separate run (an average over S seeds would scale the first moment by 1/S and the second by
    1/S², which Adam's ε then turns into a different update)."""
    cfg = config("capsnet_r1", epochs=1)
    cfgs = [dataclasses.replace(cfg, seed=s) for s in SEEDS]
    train_group(cfgs, tiny_data(), tmp_path / "stack.pt")
    stacked = torch.load(tmp_path / "stack.pt", weights_only=False)["optimizer"]["state"]
    for k, c in enumerate(cfgs):
        train(c, tiny_data(), tmp_path / f"seed{c.seed}.pt")
        alone = torch.load(tmp_path / f"seed{c.seed}.pt", weights_only=False)["optimizer"]["state"]
        for i, moments in alone.items():
            for key in ("exp_avg", "exp_avg_sq"):
                assert_close_in_norm(stacked[i][key][k], moments[key][0], f"seed {c.seed} param {i} {key}")
