"""The capturable step (train.cuda_graph: pipeline.training.steps.CapturedStep) trains what the eager
step trains. On the CPU it runs uncaptured, the very function a CUDA graph captures, and must give
bit for bit the eager run's weights, losses, learning rates, Adam state and generator states,
across an epoch boundary and a resume, for one seed and three stacked, in every experiment family.
The capture itself is tested on CUDA (tests/test_gpu.py)."""

import dataclasses
import types
import warnings

import pytest
import torch
from conftest import REPO, tiny_data
from stacks import data_for

from pipeline.core.params import load_params
from pipeline.experiments import multimnist as mm
from pipeline.experiments import table1
from pipeline.training import steps
from pipeline.training.config import run_config
from pipeline.training.train import make_optimizer, schedule, train, train_group

pytestmark = pytest.mark.filterwarnings("ignore:train.cuda_graph is on but the device is cpu")
TIMING = ("epoch_seconds", "train_images_per_second")  # the only history keys allowed to differ


def config(variant: str, **changes):
    """Two steps of 4 an epoch, three epochs, the learning rate decaying at every step (a frozen or
    misindexed rate shows), deterministic fp32 on the CPU."""
    cfg = run_config(load_params(REPO / "params.yaml"), variant, 0, device="cpu", epochs=3, batch_size=4,
                     compile=False, amp=False, deterministic=True, log_every=1, eval_batch_size=64,
                     multimnist_epoch_size=8, lr_decay_steps=1, lr_decay_rate=0.7, checkpoint_every=1)
    return dataclasses.replace(cfg, **changes)


def kill_at(monkeypatch, call: int):
    """Make the ``call``-th optimiser step of the process raise, as a kill would."""
    real, calls = steps.training_step, {"n": 0}

    def killed(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            raise KeyboardInterrupt("simulated kill")
        return real(*args, **kwargs)

    monkeypatch.setattr(steps, "training_step", killed)


def assert_same_training(mine, theirs, state_mine: dict, state_theirs: dict, where: str) -> None:
    """Two runs' results and final checkpoints: every weight, history entry (but timings), Adam
    moment and step, the scheduler's position and rate, and every generator state, equal."""
    def untimed(history: list[dict]) -> list[dict]:
        return [{k: v for k, v in h.items() if k not in TIMING} for h in history]

    for a, b in zip(mine, theirs):
        for name, value in b.model.state_dict().items():
            assert torch.equal(a.model.state_dict()[name], value), f"{where}: {name}"
        assert untimed(a.history) == untimed(b.history), where
    for i, moments in state_theirs["optimizer"]["state"].items():
        for key, value in moments.items():
            assert torch.equal(state_mine["optimizer"]["state"][i][key], value), f"{where}: Adam {i} {key}"
    for key in ("last_epoch", "_last_lr"):
        assert state_mine["scheduler"][key] == state_theirs["scheduler"][key], f"{where}: scheduler {key}"
    for g_mine, g_theirs in zip(state_mine["generators"], state_theirs["generators"]):
        assert torch.equal(g_mine, g_theirs), f"{where}: generator state"


@pytest.mark.parametrize("seeds", [(0,), (0, 1, 2)], ids=["1seed", "3seeds"])
@pytest.mark.parametrize("variant", ["capsnet_r1_recon", "baseline_cnn", "cnn_affnist", "multimnist_r1_recon"])
def test_the_capturable_step_trains_bit_for_bit_what_the_eager_step_trains(variant, seeds, tmp_path, monkeypatch,
                                                                           small_cnns):
    """capsnet_r1_recon: a CapsNet with reconstruction; baseline_cnn: dropout; cnn_affnist: §5.2's
    40×40 canvas; multimnist_r1_recon: pairs and two reconstructions. The captured run is killed in
    epoch 2's first step and resumed from epoch 1's checkpoint (its counters and order buffer set
    afresh), and the resumed process crosses from epoch 2 to 3 (the order buffer refilled)."""
    cfgs = [config(variant, seed=s) for s in seeds]
    data = data_for(cfgs[0], n_train=8)
    eager = train_group(cfgs, data, tmp_path / "eager.pt")

    ran = {"n": 0}
    run = steps.CapturedStep.run
    monkeypatch.setattr(steps.CapturedStep, "run", lambda self: ran.__setitem__("n", ran["n"] + 1) or run(self))
    graphed = [dataclasses.replace(c, cuda_graph=True) for c in cfgs]
    real = steps.training_step
    kill_at(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        train_group(graphed, data, tmp_path / "captured.pt")
    monkeypatch.setattr(steps, "training_step", real)
    resumed = train_group(graphed, data, tmp_path / "captured.pt")
    assert ran["n"] == 3 + 4  # every step the captured runs took went through CapturedStep.run
    assert [r.resumed_at for r in resumed] == [[1]] * len(seeds)
    assert_same_training(resumed, eager, torch.load(tmp_path / "captured.pt", weights_only=False),
                         torch.load(tmp_path / "eager.pt", weights_only=False), f"{variant} seeds {seeds}")


def test_the_epochs_tallies_sum_each_seeds_parts_and_keep_its_first_non_finite_step():
    """What both steps keep on the device for the loop (`_Step._tally`): per seed the sum of its
    steps' loss parts, and the global step of its first non-finite loss while it is active (a
    stopped seed's NaN is no error, a later one does not replace the first)."""
    step = steps.EagerStep(None, None, None, None, None, [None, None, None], False, 10, torch.device("cpu"))
    step.begin_epoch(2, [None] * 3, torch.tensor([1.0, 1.0, 0.0]))
    nan = float("nan")
    parts = [torch.tensor([[1.0, 0.5, 0.5], [2.0, 2.0, 0.0], [nan, nan, 0.0]]),
             torch.tensor([[3.0, 1.5, 1.5], [nan, nan, 0.0], [nan, nan, 0.0]]),
             torch.tensor([[5.0, 2.5, 2.5], [nan, nan, 0.0], [1.0, 1.0, 0.0]])]
    for p in parts:
        step._tally(p)
    assert step.sums[0].tolist() == [9.0, 4.5, 4.5]
    assert step.first_bad.tolist() == [-1, 21, -1]  # epoch 2 of 10 steps: its second step is global step 21
    assert int(step.global_step) == 23
    step.begin_epoch(3, [None] * 3, torch.ones(3))
    assert step.sums.abs().sum() == 0 and step.first_bad.tolist() == [-1] * 3 and int(step.global_step) == 30


@pytest.fixture
def autocasts(monkeypatch) -> list[dict]:
    """The keyword arguments of every `torch.autocast` the test's code opens, in order."""
    seen, real = [], torch.autocast

    def autocast(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "autocast", autocast)
    return seen


def test_a_step_hands_back_its_parts_detached_and_autocasts_with_the_weight_cache_it_is_given(monkeypatch, autocasts):
    """`training_step` returns (S, 3) loss parts that hold no graph (the epoch's sums would keep every
    step's), and autocast's cache of cast weights is its caller's: on by default, off for a captured
    step (`CapturedStep.run`), whose replays would reuse the casts made at capture."""
    weight = torch.nn.Parameter(torch.ones(2, 3))
    optimizer = torch.optim.Adam([weight])
    batch = types.SimpleNamespace(x=torch.ones(2, 4))
    loss_fn = lambda batch, keep: weight * batch.x.sum()  # noqa: E731 (S, 3)
    parts = steps.training_step(loss_fn, optimizer, None, batch, None, torch.ones(2), False)
    assert parts.grad_fn is None and not parts.requires_grad and parts.tolist() == [[8.0] * 3] * 2
    steps.training_step(loss_fn, optimizer, None, batch, None, torch.ones(2), False, cache=False)
    captured = steps.CapturedStep(None, None, loss_fn, optimizer, None, [None, None], False, 1, torch.device("cpu"),
                                  [1e-3, 1e-3])
    captured.begin_epoch(0, [None, None], torch.ones(2))
    monkeypatch.setattr(steps, "draw_step", lambda *args: (batch, None))
    captured.run()
    assert [kwargs.get("cache_enabled") for kwargs in autocasts] == [True, False, False]


def test_a_step_backpropagates_only_the_active_seeds_totals_under_bfloat16_autocast_when_amp(autocasts):
    """A seed early stopping has finished (``active`` 0.0) gets no gradient from its loss, and the step
    autocasts in bfloat16 exactly when ``amp`` says (train.amp: bfloat16, not float16's scaled loss)."""
    weight = torch.nn.Parameter(torch.ones(2, 3))
    batch = types.SimpleNamespace(x=torch.ones(2, 4))
    loss_fn = lambda batch, keep: weight * batch.x.sum()  # noqa: E731 (S, 3): seed s's total is 8 · weight[s, 0]
    steps.training_step(loss_fn, torch.optim.SGD([weight], lr=0.0), None, batch, None, torch.tensor([1.0, 0.0]), True)
    assert weight.grad.tolist() == [[8.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    steps.training_step(loss_fn, torch.optim.SGD([weight], lr=0.0), None, batch, None, torch.ones(2), False)
    assert weight.grad.tolist() == [[8.0, 0.0, 0.0], [8.0, 0.0, 0.0]]  # the sum: each seed its own gradient
    assert [(kwargs.get("dtype"), kwargs.get("enabled")) for kwargs in autocasts] == [(torch.bfloat16, True),
                                                                                      (torch.bfloat16, False)]


def test_a_step_whose_reconstruction_alone_is_not_finite_is_a_non_finite_step():
    """The total is what a step trains on: an infinite reconstruction beside a finite margin is its
    seed's first non-finite step."""
    step = steps.EagerStep(None, None, None, None, None, [None, None], False, 10, torch.device("cpu"))
    step.begin_epoch(0, [None] * 2, torch.ones(2))
    step._tally(torch.tensor([[float("inf"), 0.5, float("inf")], [1.0, 0.5, 0.5]]))
    assert step.first_bad.tolist() == [0, -1]


def test_the_learning_rate_a_step_reports_is_the_next_steps_and_the_optimizer_keeps_its_float_rate():
    """The progress bar's rate (`last_lr`) after k steps is lr·λ(k), the next step's, in both steps;
    `tensor_lr` lends the optimizer a device rate inside its block only, even one left by an error."""
    cfg = config("capsnet_r1")
    weight = torch.nn.Parameter(torch.ones(2, 3))
    optimizer, scheduler = make_optimizer(torch.nn.ParameterList([weight]), cfg, torch.device("cpu"))
    eager = steps.EagerStep(None, None, None, optimizer, scheduler, [None], False, 2, torch.device("cpu"))
    for _ in range(2):  # what an eager step does (no gradient: Adam moves nothing)
        optimizer.step()
        scheduler.step()
    table = schedule(cfg, 4)
    assert eager.last_lr(2) == table[2] == pytest.approx(cfg.lr * 0.7 ** 2)
    captured = steps.CapturedStep(None, None, None, optimizer, scheduler, [None], False, 2, torch.device("cpu"), table)
    assert captured.last_lr(3) == table[3]
    optimizer.param_groups[0]["lr"] = 0.25
    with pytest.raises(RuntimeError), steps.tensor_lr(optimizer, torch.tensor(0.5)):
        assert torch.equal(optimizer.param_groups[0]["lr"], torch.tensor(0.5))
        raise RuntimeError("a failed step")
    assert optimizer.param_groups[0]["lr"] == 0.25


def test_a_checkpoint_of_the_capturable_step_resumes_eagerly_and_back(tmp_path, monkeypatch):
    """train.cuda_graph is a speed lever, outside the checkpoint key: a run killed under it resumes
    without it (and the other way round) and ends where an uninterrupted run ends."""
    cfg = config("capsnet_r1", epochs=3)
    data = tiny_data(n_train=8)
    straight = train(cfg, data, tmp_path / "straight.pt")
    for first, then, name in ((True, False, "a.pt"), (False, True, "b.pt")):
        real = steps.training_step
        kill_at(monkeypatch, 3)
        with pytest.raises(KeyboardInterrupt):
            train(dataclasses.replace(cfg, cuda_graph=first), data, tmp_path / name)
        monkeypatch.setattr(steps, "training_step", real)
        resumed = train(dataclasses.replace(cfg, cuda_graph=then), data, tmp_path / name)
        assert resumed.resumed_at == [1]
        assert_same_training([resumed], [straight], torch.load(tmp_path / name, weights_only=False),
                             torch.load(tmp_path / "straight.pt", weights_only=False), f"{first} then {then}")


@pytest.mark.parametrize("changes", [{}, {"lr_schedule_epochs": 640, "epochs": 50, "lr_decay_steps": 2000}])
def test_the_learning_rate_table_holds_the_schedulers_values(changes):
    """`schedule` (what the captured step reads its learning rate from) equals, float for float, what
    LambdaLR sets at every step, the compressed schedule and its floor included."""
    cfg = config("capsnet_r1", lr_decay_rate=0.96, lr_min=1e-4, **changes)
    optimizer, scheduler = make_optimizer(torch.nn.Linear(2, 2), cfg, torch.device("cpu"))
    n = 3000
    table = schedule(cfg, n)
    stepped = [scheduler.get_last_lr()[0]]
    for _ in range(n):
        optimizer.step()
        scheduler.step()
        stepped.append(scheduler.get_last_lr()[0])
    assert table == stepped
    assert len(set(table)) > 2 and table[-1] >= cfg.lr_min  # it decays, and the floor holds


@pytest.mark.parametrize("variant", ["capsnet_r1", "multimnist_r1_recon"])
def test_a_batch_drawn_for_a_device_counter_is_the_batch_drawn_for_the_step(variant):
    """An experiment's `batch` takes the captured step's counter (a 0-d device tensor) and draws
    what it draws for the int; Table 1's steps cover consecutive, disjoint slices of the order."""
    cfg = config(variant)
    data = data_for(cfg, n_train=24)
    exp = cfg.experiment_module().Training(cfg, data, torch.device("cpu"))
    assert exp.capturable
    order = exp.epoch_order(torch.Generator().manual_seed(0))
    for step in range(exp.steps_per_epoch):
        a = exp.batch(order, step, torch.Generator().manual_seed(step))
        b = exp.batch(order, torch.tensor(step), torch.Generator().manual_seed(step))
        for x, y in zip(a, b):
            assert (x is None and y is None) or torch.equal(x, y)
        if order is not None:  # the step's own slice of the order, in order
            assert torch.equal(a.labels, exp.labels[order[step * cfg.batch_size:(step + 1) * cfg.batch_size]])


def test_an_experiment_that_cannot_be_captured_trains_uncaptured_and_says_so(tmp_path, monkeypatch):
    """An experiment whose Training does not say capturable = True (a plug-in written before the
    key) trains with the eager step under train.cuda_graph, and the warning says why."""
    monkeypatch.setattr(table1.Training, "capturable", False)
    cfg = config("capsnet_r1", epochs=1)
    with pytest.warns(UserWarning, match="does not say capturable = True"):
        mine = train(dataclasses.replace(cfg, cuda_graph=True), tiny_data(n_train=8), tmp_path / "a.pt")
    theirs = train(cfg, tiny_data(n_train=8), tmp_path / "b.pt")
    assert all(torch.equal(a, b) for a, b in zip(mine.model.state_dict().values(), theirs.model.state_dict().values()))


class FakeGraph:
    """Stands in for torch.cuda.CUDAGraph on a machine without CUDA: its capture fails."""

    def register_generator_state(self, generator):
        torch.rand(1, generator=generator)  # as if the attempt had moved the generator on


def test_a_failed_capture_says_so_and_trains_on_uncaptured_from_the_same_state(tmp_path, monkeypatch):
    """CUDA's path on the CPU, with torch.cuda's streams and graph stood in for: WARMUP_STEPS eager
    steps, then a capture that fails: one warning naming the failure, and the run goes on with the
    same step uncaptured, ending where the eager run ends."""
    import contextlib

    def failing_graph(graph):
        for group in made[0].optimizer.param_groups:  # what CapturedStep sets on CUDA: Adam on the CPU refuses it
            group["capturable"] = True
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    stream = type("FakeStream", (), {"wait_stream": lambda self, other: None})
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream())
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", failing_graph)
    made = []
    init = steps.CapturedStep.__init__

    def capturing(self, *args):
        init(self, *args)
        self.capture = True  # as on CUDA
        made.append(self)

    monkeypatch.setattr(steps.CapturedStep, "__init__", capturing)
    cfg = config("capsnet_r1", epochs=3)
    data = tiny_data(n_train=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mine = train(dataclasses.replace(cfg, cuda_graph=True), data, tmp_path / "a.pt")
    failed = [str(w.message) for w in caught if "capturing the step failed" in str(w.message)]
    assert failed == ["train.cuda_graph: capturing the step failed (operation not permitted when stream is "
                      "capturing); training on uncaptured, the same step run eagerly"]
    assert made[0].eager_steps == steps.WARMUP_STEPS and made[0].graph is None and not made[0].capture
    theirs = train(cfg, data, tmp_path / "b.pt")
    assert_same_training([mine], [theirs], torch.load(tmp_path / "a.pt", weights_only=False),
                         torch.load(tmp_path / "b.pt", weights_only=False), "after a failed capture")


def test_multimnist_draws_need_no_order(monkeypatch):
    """MultiMNIST's epoch has no order: the captured step keeps no order buffer and still draws
    each seed's pairs from its own generator."""
    cfg = config("multimnist_r1_recon")
    data = data_for(cfg, n_train=12)
    exp = cfg.experiment_module().Training(cfg, data, torch.device("cpu"))
    assert exp.epoch_order(torch.Generator()) is None
    labels = [exp.batch(None, torch.tensor(0), torch.Generator().manual_seed(s)).labels for s in (0, 1)]
    assert not torch.equal(labels[0], labels[1])
    assert mm.Training.capturable
