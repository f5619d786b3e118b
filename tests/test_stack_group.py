"""A stacked group's seeds each keep their own run (pipeline.training.train.train_group): a seed that stops
early freezes while the others train on, a group killed mid-epoch resumes to the uninterrupted weights,
its checkpoint resumes no other group, and the train stage refuses what would mix seeds' outputs."""

import dataclasses

import pytest
import torch

from conftest import REPO, Recorder, disk_full_midway, tiny_data
from stacks import SEEDS, assert_close_in_norm, config
from pipeline.core.params import load_params
from pipeline.training import steps
from pipeline.training import checkpoint
from pipeline.training.train import train, train_group


def seed_one_stops_after_epoch_one(monkeypatch, before_score=lambda call: None) -> dict:
    """A constructed test error for a group of SEEDS with a target of 90 %: seed 1 reaches it at its
    first score and no other seed ever does (scored in seed order: 0, 1, 2 in epoch 1, then 0, 2);
    ``before_score(call)`` runs before each. The count of scores so far, in ["n"]; a run without a
    target (target_accuracy_pct 0) never stops, whatever it is told."""
    calls = {"n": 0}

    def constructed(training, model, batch_size, amp):
        calls["n"] += 1
        before_score(calls["n"])
        return 5.0 if calls["n"] == 2 else 50.0

    monkeypatch.setattr("pipeline.experiments.table1.Training.test_error", constructed)
    return calls


def test_a_seed_that_stops_early_freezes_while_the_others_train_on(tmp_path, monkeypatch):
    """§5.2's early stopping per seed: a constructed error sequence stops seed 1 after epoch 1; it
    ends with its separate run's epoch-1 weights, the others train every epoch."""
    cfg = config("capsnet_r1", epochs=3, target_accuracy_pct=90.0)
    seed_one_stops_after_epoch_one(monkeypatch)
    cfgs = [dataclasses.replace(cfg, seed=s) for s in SEEDS]
    stacked = train_group(cfgs, tiny_data(), tmp_path / "stack.pt")
    assert [len(r.history) for r in stacked] == [3, 1, 3]
    assert [r.stop_reason for r in stacked] == ["budget", "target", "budget"]
    alone = train(dataclasses.replace(cfgs[1], epochs=1, target_accuracy_pct=0.0), tiny_data(), tmp_path / "one.pt")
    for name, value in alone.model.state_dict().items():
        assert_close_in_norm(stacked[1].model.state_dict()[name], value, f"seed 1 {name}")
    state = torch.load(tmp_path / "stack.pt", weights_only=False)
    assert [s["stop_reason"] for s in state["seeds"]] == ["budget", "target", "budget"]


def test_a_stopped_seeds_slice_gone_non_finite_fails_neither_the_others_steps_nor_their_checkpoint(tmp_path,
                                                                                                    monkeypatch):
    """Once a seed stops, its slice of the stack is no longer its run (its result is the weights it
    stopped with): seed 1 stops after epoch 1 and its slice is then made non-finite; the others train
    on to epoch 3, checkpointed every epoch, and every result is finite (seed 1's: the weights it stopped with)."""
    from pipeline.training import train as train_module

    built = {}
    build_group = train_module.build_group
    monkeypatch.setattr(train_module, "build_group", lambda *args: built.setdefault("group", build_group(*args)))

    def poison_seed_one(call):
        if call == 4:  # epoch 2, seed 1 stopped: its slice goes non-finite before the checkpoint
            with torch.no_grad():
                for w in built["group"][0].seed_weights(1).values():
                    w.fill_(float("nan"))

    calls = seed_one_stops_after_epoch_one(monkeypatch, poison_seed_one)
    cfg = config("capsnet_r1", epochs=3, target_accuracy_pct=90.0, checkpoint_every=1)
    stacked = train_group([dataclasses.replace(cfg, seed=s) for s in SEEDS], tiny_data(), tmp_path / "stack.pt")
    assert [len(r.history) for r in stacked] == [3, 1, 3] and calls["n"] == 7
    for k, result in enumerate(stacked):
        assert all(torch.isfinite(w).all() for w in result.model.state_dict().values()), f"seed {SEEDS[k]}"


def test_a_stacked_run_killed_mid_epoch_resumes_to_the_uninterrupted_weights(tmp_path, monkeypatch, small_cnns):
    """Killed during epoch 2's second step (baseline_cnn: dropout masks come from the seeds'
    generators, which the checkpoint carries), then resumed."""
    cfgs = [dataclasses.replace(config("baseline_cnn", epochs=3), seed=s) for s in SEEDS]
    data = tiny_data()
    straight = train_group(cfgs, data, tmp_path / "a.pt")
    real, calls = steps.training_step, {"n": 0}

    def killed(*args):
        calls["n"] += 1
        if calls["n"] == 4:  # 2 steps an epoch: the second step of epoch 2
            raise KeyboardInterrupt("simulated kill")
        return real(*args)

    monkeypatch.setattr(steps, "training_step", killed)
    with pytest.raises(KeyboardInterrupt):
        train_group(cfgs, data, tmp_path / "b.pt")
    monkeypatch.setattr(steps, "training_step", real)
    recorders = [Recorder() for _ in SEEDS]
    resumed = train_group(cfgs, data, tmp_path / "b.pt", loggers=recorders)
    assert [[e for e, _ in r.epochs] for r in recorders] == [[2, 3]] * 3
    for k in range(len(SEEDS)):
        assert resumed[k].resumed_at == [1]
        for name, value in straight[k].model.state_dict().items():
            assert torch.equal(value, resumed[k].model.state_dict()[name]), (k, name)


def test_a_group_killed_after_a_seed_stopped_resumes_with_its_stopped_weights_and_every_seeds_extras(tmp_path,
                                                                                                     monkeypatch):
    """Seed 1 stops after epoch 1; the group is killed in epoch 2 and resumed without extras: every seed
    ends as the uninterrupted group's, seed 1 with the weights it stopped with (its slice of the stack
    has drifted since, under Adam's momentum), and the checkpoint still carries each seed's extras
    (its tracking run id: a second resume logs on into it)."""
    calls = seed_one_stops_after_epoch_one(monkeypatch)
    cfgs = [dataclasses.replace(config("capsnet_r1", epochs=3, target_accuracy_pct=90.0), seed=s) for s in SEEDS]
    straight = train_group(cfgs, tiny_data(), tmp_path / "a.pt")
    calls["n"] = 0
    real, taken = steps.training_step, {"n": 0}

    def killed(*args, **kwargs):
        taken["n"] += 1
        if taken["n"] == 3:  # 2 steps an epoch: epoch 2's first, after epoch 1's checkpoint
            raise KeyboardInterrupt("simulated kill")
        return real(*args, **kwargs)

    monkeypatch.setattr(steps, "training_step", killed)
    extras = [{"run_id": f"run-{s}"} for s in SEEDS]
    with pytest.raises(KeyboardInterrupt):
        train_group(cfgs, tiny_data(), tmp_path / "b.pt", extras=extras)
    monkeypatch.setattr(steps, "training_step", real)
    resumed = train_group(cfgs, tiny_data(), tmp_path / "b.pt")
    assert [r.resumed_at for r in resumed] == [[1]] * 3 and [len(r.history) for r in resumed] == [3, 1, 3]
    for k in range(len(SEEDS)):
        for name, value in straight[k].model.state_dict().items():
            assert torch.equal(value, resumed[k].model.state_dict()[name]), (k, name)
    assert [s["extra"] for s in torch.load(tmp_path / "b.pt", weights_only=False)["seeds"]] == extras


def test_a_group_checkpoint_does_not_resume_another_group(tmp_path):
    cfg = config("capsnet_r1", epochs=1)
    train_group([dataclasses.replace(cfg, seed=s) for s in (0, 1)], tiny_data(), tmp_path / "g.pt")
    with pytest.warns(UserWarning, match="another configuration"):
        assert checkpoint.load_checkpoint(tmp_path / "g.pt", [dataclasses.replace(cfg, seed=s) for s in (0, 2)]) is None


def test_a_group_checkpoint_resumes_only_in_its_seeds_order(tmp_path):
    """A checkpoint holds each seed's state at its place in the stack: the same seeds in another order
    (`capsnet train V 1,0` after `0,1`) would hand seed 0's weights to seed 1, so they start afresh."""
    cfg = config("capsnet_r1")
    in_order = [dataclasses.replace(cfg, seed=s) for s in (0, 1)]
    torch.save({"digest": checkpoint.group_digest(in_order), "stack": {}}, tmp_path / "g.pt")
    assert checkpoint.load_checkpoint(tmp_path / "g.pt", in_order) is not None
    with pytest.warns(UserWarning, match="another configuration"):
        assert checkpoint.load_checkpoint(tmp_path / "g.pt", in_order[::-1]) is None


def test_a_checkpoint_write_cut_short_leaves_the_last_one_whole(tmp_path, monkeypatch):
    """A write that fails part-way (a full disk, a kill) never replaces the last checkpoint, and
    leaves no partial file beside it: the next start resumes from the last whole one."""
    cfg = config("capsnet_r1")
    path = tmp_path / "g.pt"
    weights = {"w": torch.ones(2)}
    checkpoint.save_checkpoint(path, {"digest": checkpoint.group_digest([cfg]), "stack": {}, "epoch": 1}, weights)
    monkeypatch.setattr(torch, "save", disk_full_midway)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save_checkpoint(path, {"digest": checkpoint.group_digest([cfg]), "stack": {}, "epoch": 2}, weights)
    monkeypatch.undo()
    assert checkpoint.load_checkpoint(path, cfg)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["g.pt"]


def test_a_checkpoint_of_the_trainer_before_stacks_starts_afresh(tmp_path):
    """A checkpoint with the group's key but no stack (one seed's model, as trainers wrote before
    stacked seeds) is not resumed: what it holds is not what the loop restores."""
    cfg = config("capsnet_r1", epochs=1)
    torch.save({"digest": checkpoint.group_digest([cfg]), "epoch": 0, "model": {}}, tmp_path / "old.pt")
    with pytest.warns(UserWarning, match="older trainer"):
        assert checkpoint.load_checkpoint(tmp_path / "old.pt", cfg) is None


def test_a_group_must_share_everything_but_the_seed():
    cfg = config("capsnet_r1")
    with pytest.raises(ValueError, match="every setting but the seed"):
        checkpoint.group_config([cfg, dataclasses.replace(cfg, seed=1, lr=2e-3)])
    with pytest.raises(Exception, match="repeat"):
        checkpoint.group_config([cfg, cfg])


def test_a_one_seed_groups_key_is_its_runs_own_no_seeds_no_checkpoint_and_non_finite_weights_are_named(tmp_path):
    """A one-seed group resumes a separate run's checkpoint (its key is the run's digest); a group of no
    seeds is refused; no file is no checkpoint; non-finite weights are refused naming the first three
    floating-point tensors (integer tensors are never non-finite)."""
    cfg = config("capsnet_r1")
    assert checkpoint.group_digest([cfg]) == cfg.digest()
    assert checkpoint.group_digest([cfg, dataclasses.replace(cfg, seed=1)]) != cfg.digest()
    with pytest.raises(ValueError, match="no seeds to train"):
        checkpoint.group_config([])
    assert checkpoint.load_checkpoint(tmp_path / "none.pt", cfg) is None and not list(tmp_path.iterdir())
    bad = {name: torch.tensor([float("nan")]) for name in "abcd"} | {"steps": torch.tensor([7])}
    with pytest.raises(checkpoint.NonFiniteLossError, match=r"^x: non-finite weights in a, b, c …; nothing saved"):
        checkpoint.assert_finite_weights(bad, "x")
    checkpoint.assert_finite_weights({"steps": torch.tensor([7]), "w": torch.ones(2)}, "x")


def test_the_train_stage_refuses_seeds_that_would_share_an_output_directory(tmp_path):
    """run_group writes seed k into out_dirs[k]: two seeds into one directory (or a list of another
    length) would overwrite one seed's model with the other's, so it is refused before any work."""
    from pipeline.core.errors import UserError
    from pipeline.stages import train as train_stage

    params = load_params(REPO / "params.yaml")
    for out_dirs in ([tmp_path / "m", tmp_path / "m"], [tmp_path / "m"]):
        with pytest.raises(UserError, match=r"capsnet_r1: 2 seed\(s\) need as many distinct output directories"):
            train_stage.run_group(params, "capsnet_r1", [0, 1], tmp_path / "data", out_dirs, tmp_path / "c.pt")
    assert not (tmp_path / "m").exists()


def test_the_paper_protocol_on_a_cpu_warns_with_its_hours_before_any_work(tmp_path, monkeypatch):
    """The variant's own experiment's measured CPU seconds per 60k-image epoch (§5.2's CapsNet: 2,370 s)
    × 640 epochs × 2 seeds: about 843 h, said before anything trains; the smoke profile is not warned."""
    import warnings

    from pipeline.core.errors import UserError
    from pipeline.experiments import affnist
    from pipeline.stages import train as train_stage

    paper = load_params(REPO / "params.yaml")
    paper = dataclasses.replace(paper, train=dataclasses.replace(paper.train, device="cpu"))
    monkeypatch.setattr(affnist, "training_data", lambda data_dir, cfg: ({"train_images": torch.empty(60_000, 0)}, []))
    (tmp_path / "file").write_text("")
    out_dirs = [tmp_path / "file" / "seed0", tmp_path / "file" / "seed1"]  # under a file: the output check stops it

    def run_group(params):
        with pytest.raises(UserError, match="output"):
            train_stage.run_group(params, "capsnet_affnist", [0, 1], tmp_path, out_dirs, tmp_path / "c.pt")

    with pytest.warns(UserWarning, match=r"capsnet_affnist seed\(s\) \[0, 1\]: 640 epochs on a CPU take about 843 h"):
        run_group(paper)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_group(dataclasses.replace(paper, base=dataclasses.replace(paper.base, profile="smoke")))
