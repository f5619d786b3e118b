"""Wiring: a recipe, a flag or a generator must reach the code that trains, not only the
equation tests. Each test here fails when the switch it names is cut (scripts/mutate.py applies
those cuts to a scratch copy and runs these tests)."""

import ast
import dataclasses
import json

import pytest
import torch
from conftest import REPO, Recorder, script, tiny_data

from pipeline.core.params import load_params
from pipeline.models.capsnet import capsnet_loss
from pipeline.training import train as train_module
from pipeline.training.config import run_config
from pipeline.training.train import build_model, to_float, train


def one_step_config(variant: str, batch: int = 8):
    """The committed params' variant, trained for one full-batch step on CPU without shifts (so the
    step's loss is a function of the initial weights and the data alone, whatever the order)."""
    cfg = run_config(load_params(REPO / "params.yaml"), variant, 0)
    return dataclasses.replace(cfg, epochs=1, batch_size=batch, max_shift=0, device="cpu", compile=False,
                               amp=False, deterministic=True, log_every=1, eval_batch_size=batch, checkpoint_every=1)


@pytest.mark.parametrize("variant,recipe", [("capsnet_r3_recon_official", "official"), ("capsnet_r3_recon", "paper")])
def test_a_variant_trains_with_its_recipes_loss_and_model(tmp_path, variant, recipe):
    """params.yaml's recipe reaches the loss the loop logs and the model it trains (the 12 published
    official-recipe runs rest on this): the logged margin term is the recipe's on the same batch and
    initial weights, the official one Eq. 4 / 20; the trained model has the recipe's layers and init."""
    cfg = one_step_config(variant)
    assert cfg.recipe == recipe
    data = tiny_data(n_train=8, n_test=8)
    recorder = Recorder()
    result = train(cfg, data, tmp_path / "ckpt.pt", logger=recorder)
    [(_, logged)] = recorder.epochs

    torch.manual_seed(cfg.seed)  # the loop's first draw: the initial weights
    model = build_model(cfg)
    x, y = to_float(data["train_images"]), data["train_labels"].long()  # (8, 1, 28, 28), (8,)
    with torch.no_grad():
        out = model(x, y)
        _, paper_margin, recon = capsnet_loss(out, x, y, recipe="paper")
        _, official_margin, _ = capsnet_loss(out, x, y, recipe="official")
    expected = official_margin if recipe == "official" else paper_margin
    assert logged["margin_loss"] == pytest.approx(float(expected), rel=1e-5)
    assert logged["reconstruction_loss"] == pytest.approx(float(recon), rel=1e-5)
    if recipe == "official":
        assert logged["margin_loss"] == pytest.approx(float(paper_margin) / 20, rel=1e-5)

    trained = result.model  # one Adam step (lr 1e-3) moves no weight far from its initialisation
    official = recipe == "official"
    assert (trained.primary.conv.bias is None) == official  # conv/32 + a (32, 8) bias, or a plain conv
    assert (trained.digits.bias is not None) == official
    w_std = float(trained.digits.W.detach().std())  # truncated normal std 0.1 (≈ 0.088 after the ±2σ cut), or 0.01
    assert (0.08 < w_std < 0.095) if official else (0.009 < w_std < 0.0115)


@pytest.fixture
def backend_flags():
    """torch's process-wide backend switches (TF32, cuDNN autotuning, deterministic algorithms) as they
    were before the test, whatever the test sets."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark,
             torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved[:3]
    torch.use_deterministic_algorithms(saved[3], warn_only=saved[4])


def test_tf32_is_on_only_where_train_tf32_says(backend_flags):
    """On CUDA an fp32 run is fp32: train.tf32 (default false) sets TF32 for matmuls and cuDNN's
    convolutions, whose torch default is on; on a CPU nothing is touched. (A torch.device("cuda")
    object needs no GPU: only the flags are read.)"""
    cfg = one_step_config("capsnet_r1")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # torch's cuDNN default
    train_module.configure_backends(cfg, torch.device("cpu"))
    assert torch.backends.cudnn.allow_tf32 is True
    for flag in (False, True, False):
        train_module.configure_backends(dataclasses.replace(cfg, tf32=flag), torch.device("cuda"))
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (flag, flag)
    assert cfg.tf32 is False and dataclasses.replace(cfg, tf32=True).digest() != cfg.digest()  # precision: the key


def test_cudnn_autotunes_on_cuda_only_where_the_run_need_not_be_deterministic_and_adam_is_fused_there(backend_flags):
    """cuDNN's benchmark mode times convolution algorithms and keeps the fastest, which may differ from
    run to run: on CUDA it is on for deterministic: false (the gpu profiles') and off for deterministic:
    true, with torch's deterministic switch set to match; a CPU run leaves it as it is. On CUDA Adam is
    fused (one kernel for every parameter), on a CPU torch's default. (The devices need no GPU: only
    flags are set and read.)"""
    cfg = one_step_config("capsnet_r1")
    for deterministic in (True, False, True):
        train_module.configure_backends(dataclasses.replace(cfg, deterministic=deterministic), torch.device("cuda"))
        assert torch.backends.cudnn.benchmark is (not deterministic)
        assert torch.are_deterministic_algorithms_enabled() is deterministic
    train_module.configure_backends(dataclasses.replace(cfg, deterministic=False), torch.device("cpu"))
    assert torch.backends.cudnn.benchmark is False
    for device, fused in (("cuda", True), ("cpu", False)):
        optimizer, _ = train_module.make_optimizer(torch.nn.Linear(2, 2), cfg, torch.device(device))
        assert bool(optimizer.defaults["fused"]) is fused, device


def test_the_evaluate_stage_runs_the_model_in_the_precision_it_trained_in(tmp_path, monkeypatch, backend_flags):
    """An fp32 run's evaluation on CUDA is fp32 too: the evaluate stage's load_model sets TF32 from the
    run's config as training did (the device faked: only the flags are read)."""
    import json

    from safetensors.torch import save_file

    from pipeline.stages import evaluate as evaluate_stage

    cfg = one_step_config("capsnet_r1")
    (tmp_path / "config.json").write_text(json.dumps({"config": dataclasses.asdict(cfg)}))
    save_file(train_module.build_model(cfg).state_dict(), str(tmp_path / "model.safetensors"))
    monkeypatch.setattr(evaluate_stage, "resolve_device", lambda _: torch.device("cuda"))
    monkeypatch.setattr(evaluate_stage, "place_model", lambda model, *_: model)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # torch's cuDNN default
    evaluate_stage.load_model(tmp_path)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)


@pytest.mark.parametrize("compile_", [False, True])
def test_the_deterministic_flag_reaches_torch(compile_):
    """train.deterministic switches torch's deterministic algorithms on and off, compiled or eager
    (eager sets the switch without importing inductor; compiled also sets inductor's kernels)."""
    cfg = one_step_config("capsnet_r1")
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        for flag in (True, False, True):
            train_module.configure_backends(dataclasses.replace(cfg, deterministic=flag, compile=compile_),
                                            torch.device("cpu"))
            assert torch.are_deterministic_algorithms_enabled() is flag
            assert torch.is_deterministic_algorithms_warn_only_enabled()  # a missing kernel warns, not fails
            if compile_:
                import torch._inductor.config as inductor_config

                assert inductor_config.deterministic is flag
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


class DropoutNet(torch.nn.Module):
    """A tiny classifier with dropout whose masks, as BaselineCNN's, come from the run's generator
    (on the training device: CPU or CUDA) through `dropout_keep`."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(28 * 28, 32)
        self.dropout = torch.nn.Dropout(0.5)
        self.out = torch.nn.Linear(32, 10)

    def forward(self, images, keep=None):
        x = torch.relu(self.fc1(images.flatten(1)))  # (B, 32)
        return self.out(self.dropout(x) if keep is None else x * keep)  # (B, 10)

    def dropout_keep(self, batch, generator):
        return (torch.rand(batch, 32, generator=generator, device=generator.device) >= 0.5).float() / 0.5


def kill_and_resume(tmp_path, monkeypatch, device: str):
    monkeypatch.setattr(train_module, "build_model", lambda cfg: DropoutNet())
    cfg = dataclasses.replace(one_step_config("baseline_cnn"), epochs=3, batch_size=16, max_shift=2, device=device)
    data = tiny_data()
    straight = train(cfg, data, tmp_path / "a.pt")
    with pytest.raises(KeyboardInterrupt):
        train(cfg, data, tmp_path / "b.pt", logger=Recorder(stop_after=1))
    resumed = train(cfg, data, tmp_path / "b.pt")
    assert resumed.resumed_at == [1]
    return straight, resumed


def test_resume_restores_the_generator_that_dropout_draws_from(tmp_path, monkeypatch):
    """A killed run with dropout resumes to the uninterrupted run's weights bit for bit: the run's
    generator (order, shifts and dropout masks) and the optimizer restored."""
    straight, resumed = kill_and_resume(tmp_path, monkeypatch, "cpu")
    for key, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    assert [h["train_loss"] for h in straight.history] == [h["train_loss"] for h in resumed.history]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_resume_restores_the_cuda_generator(tmp_path, monkeypatch):
    """On CUDA the run's generator (order, shifts, dropout masks) is a CUDA generator: its state must
    come back with the checkpoint."""
    straight, resumed = kill_and_resume(tmp_path, monkeypatch, "cuda")
    for key, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key


def test_the_compiled_step_computes_what_eager_computes(tmp_path):
    """The gpu profile trains model + loss compiled together (train.compile): the training loop
    with inductor on CPU, two seeds stacked (vmap inside the compiled graph) of an official CapsNet
    with 3 routing iterations and reconstruction, ends with eager's weights and losses within float
    tolerance (only the order of sums may differ), so CI runs the compiled path."""
    cfg = dataclasses.replace(one_step_config("capsnet_r3_recon_official"), batch_size=16, epochs=1)
    data = tiny_data(n_train=32)  # 2 steps
    runs = {}
    for compile_ in (False, True):
        cfgs = [dataclasses.replace(cfg, compile=compile_, seed=s) for s in (0, 1)]
        runs[compile_] = train_module.train_group(cfgs, data, tmp_path / f"{compile_}.pt")
    for eager, compiled in zip(runs[False], runs[True]):
        assert compiled.history[0]["train_loss"] == pytest.approx(eager.history[0]["train_loss"], rel=1e-5)
        for name, value in eager.model.state_dict().items():
            off = float((compiled.model.state_dict()[name] - value).norm() / value.norm())
            assert off < 1e-5, f"{name}: {off:.1e}"


def test_grad_diffs_compares_a_bf16_step_with_an_fp32_one_parameter_by_parameter(monkeypatch, capsys):
    """scripts/grad_diffs.py, whose numbers set test_gpu.py's per-layer bounds: one line per variant with
    every parameter's relative gradient difference of bf16 autocast against fp32, from the same weights
    and batch with dropout off (baseline_cnn has dropout: two masks drawn apart fail the 0.5 bound)."""
    grad_diffs = script("grad_diffs")
    monkeypatch.setattr("sys.argv", ["grad_diffs.py", "--batch", "4", "baseline_cnn"])
    grad_diffs.main()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    row = json.loads(lines[0])
    assert (row["variant"], row["device"], row["batch"]) == ("baseline_cnn", "cpu", 4)
    cfg = one_step_config("baseline_cnn")
    assert row["grad_rel_diff"].keys() == dict(build_model(cfg).named_parameters()).keys()
    diffs = row["grad_rel_diff"].values()
    assert 0 < row["loss_rel_diff"] < 0.05
    assert max(diffs) > 0, "bf16 rounded nothing: the two steps ran in one precision"
    assert max(diffs) < 0.5, row["grad_rel_diff"]  # bf16's rounding, not another network or batch


def test_the_gpu_session_runs_every_cuda_only_test():
    """Every test file with a CUDA-only test is in the list gpu_session.sh runs (scripts/gpu_proof.py files,
    whose key hashes them), and every such test is marked cuda (the session selects by the mark): none is
    left that no script ever runs."""
    import subprocess
    import sys

    listed = set(subprocess.run([sys.executable, "scripts/gpu_proof.py", "files"], cwd=REPO, capture_output=True,
                                text=True, check=True).stdout.split())
    for path in sorted((REPO / "tests").glob("test_*.py")):
        text = path.read_text()
        if "needs CUDA" in text:
            assert f"tests/{path.name}" in listed, f"{path.name} has CUDA-only tests gpu_session.sh does not run"
            skips = text.count('reason="needs CUDA"') - text.count("pytestmark = [pytest.mark.cuda")
            assert skips <= text.count("@pytest.mark.cuda"), f"{path.name}: a CUDA-only test without the cuda mark"


def test_every_mutation_still_finds_the_line_it_cuts():
    """scripts/mutate.py's mutations name their code by a line: one a refactor rewrote would report
    STALE only when a sweep runs (one did on 2026-11-26, left behind when costs.speed changed)."""
    mutate = script("mutate")
    stale = [m.name for m in mutate.MUTATIONS if m.old not in (REPO / m.path).read_text()]
    assert not stale, f"mutations whose line is gone: {stale}"
    missing = [t for m in mutate.MUTATIONS for t in m.tests if not (REPO / t.split("::")[0]).is_file()]
    assert not missing, f"mutations naming test files that do not exist: {missing}"
    gone = [t for m in mutate.MUTATIONS for t in m.tests if "::" in t
            and f"def {t.split('::')[1].split('[')[0]}(" not in (REPO / t.split("::")[0]).read_text()]
    assert not gone, f"mutations naming tests that do not exist: {gone}"  # a parameter id: mutate.py says BROKEN


def test_every_mutation_cuts_one_place():
    """mutate.py cuts a mutation's line where it first stands: a line standing twice (an `if unknown:` of
    two functions; a line of mutate.py's own code that its list also spells) was cut wherever came first,
    which an edit above it could change without a word."""
    mutate = script("mutate")
    texts = {path: (REPO / path).read_text() for path in {m.path for m in mutate.MUTATIONS}}
    places = {m.name: texts[m.path].count(m.old) for m in mutate.MUTATIONS}
    twice = [f"{name}: {n} places" for name, n in places.items() if n > 1]
    assert not twice, f"mutations whose line stands in several places: {twice}"


def test_a_mutation_whose_line_stands_twice_is_not_run_and_says_so(monkeypatch, capsys):
    """The sweep refuses a line standing twice, as it refuses one that is gone: it names the mutation, runs
    no test for it and counts it against the list (exit 1)."""
    mutate = script("mutate")
    twice = mutate.Mutation("a line standing twice", "pipeline/x.py", "x = 1\n", "x = 2\n", ("tests/test_x.py",))
    runs = []
    monkeypatch.setattr(mutate, "MUTATIONS", [twice])
    monkeypatch.setattr(mutate, "run_tests", lambda copy, tests: runs.append(tests) or True)
    monkeypatch.setattr(mutate, "scratch_copy", lambda dest: (dest / "pipeline").mkdir() or
                        (dest / "pipeline" / "x.py").write_text("x = 1\ny = 0\nx = 1\n"))
    monkeypatch.setattr("sys.argv", ["mutate.py"])
    assert mutate.main() == 1
    assert runs == [("tests/test_x.py",)]  # the unmutated copy's run only
    assert "AMBIGUOUS a line standing twice: its line stands 2 times in pipeline/x.py" in capsys.readouterr().err


def test_each_test_id_constant_of_the_mutation_list_is_bound_once():
    """A second ``RUN_RECORD = …`` (2026-11-28) silently moved three older mutations onto another
    test, which did not catch them; a sweep would have called the three bugs untested."""
    tree = ast.parse((REPO / "scripts" / "mutate.py").read_text())
    names = [target.id for node in tree.body if isinstance(node, ast.Assign)
             for target in node.targets if isinstance(target, ast.Name)]
    assert not [name for name in set(names) if names.count(name) > 1]


def test_a_mutation_naming_a_test_that_does_not_exist_is_broken_not_caught():
    """pytest's "not found" exits 4, not 0: read as a failing test it counted a mutation as caught that
    nothing tested (one named a parameter id a test had renamed, until 2026-11-28)."""
    mutate = script("mutate")
    with pytest.raises(mutate.NamedTestsError, match="not found"):
        mutate.run_tests(REPO, ("tests/test_wiring.py::test_no_such_test",))
    # a mutation that breaks the import makes pytest exit 4 too: that one is caught
    assert not mutate.named_tests_missing(4, "ERROR: found no collectors for /tmp/copy/tests/test_x.py::test_y")


def test_a_sample_of_the_mutations_is_n_distinct_ones_in_the_lists_order_and_its_seed_draws_it_again():
    mutate = script("mutate")
    drawn = mutate.sample(mutate.MUTATIONS, 40, seed=7)
    assert len(set(drawn)) == 40 and drawn == sorted(drawn, key=mutate.MUTATIONS.index)
    assert drawn == mutate.sample(mutate.MUTATIONS, 40, seed=7) != mutate.sample(mutate.MUTATIONS, 40, seed=8)
    assert mutate.sample(mutate.MUTATIONS[:5], 40, seed=7) == mutate.MUTATIONS[:5]  # more than there are: all


def test_the_share_a_sample_says_is_caught_is_clopper_pearsons_one_sided_bound():
    bound = script("mutate").caught_at_least
    assert bound(60, 60) == pytest.approx(0.05 ** (1 / 60), abs=1e-9)  # all caught: alpha^(1/n) in closed form
    assert bound(9, 10) == pytest.approx(0.60584, abs=1e-5)  # scipy.stats.beta.ppf(0.05, 9, 2)
    assert bound(9, 10, alpha=0.025) == pytest.approx(0.55498, abs=1e-5)  # the two-sided 95 % interval's lower end
    assert bound(0, 10) == 0


def copying_the_files_of(mutations):
    """A stand-in for mutate.py's scratch_copy that copies only the files ``mutations`` cut."""
    def scratch_copy(dest):
        for m in mutations:
            (dest / m.path).parent.mkdir(parents=True, exist_ok=True)
            (dest / m.path).write_text((REPO / m.path).read_text())
    return scratch_copy


def test_a_sampled_sweep_runs_only_the_drawn_mutations_and_bounds_the_whole_lists_share(monkeypatch, capsys, tmp_path):
    """--sample reaches the sweep (the tests run are the drawn mutations' own) and its summary, one
    survivor among them lowering the bound."""
    mutate = script("mutate")
    drawn = mutate.sample(mutate.MUTATIONS, 4, seed=3)
    runs = []

    def run_tests(copy, tests):
        runs.append(tests)
        return len(runs) in (1, 2)  # the unmutated copy passes, then the first drawn mutation survives

    monkeypatch.setattr(mutate, "run_tests", run_tests)
    monkeypatch.setattr(mutate, "scratch_copy", copying_the_files_of(drawn))
    monkeypatch.setattr("sys.argv", ["mutate.py", "--sample", "4", "--seed", "3"])
    assert mutate.main() == 1
    out = capsys.readouterr().out
    assert runs[1:] == [m.tests for m in drawn]
    assert f"drawn 4 of {len(mutate.MUTATIONS)} mutations (--sample 4 --seed 3 draws them again)" in out
    assert "3 of 4 mutations caught" in out
    assert f"so of all {len(mutate.MUTATIONS)}, at least {100 * mutate.caught_at_least(3, 4):.1f} % are caught" in out


def test_a_sweep_by_test_runs_only_the_mutations_naming_such_a_test_and_says_when_none_does(monkeypatch, capsys):
    """--test picks the mutations whose named tests a change moved or edited (a test file split in two):
    each one named runs, no other, and a filter nothing matches says so in one line instead of sweeping."""
    mutate = script("mutate")
    wanted = [m for m in mutate.MUTATIONS if any("test_report_affnist.py" in t for t in m.tests)]
    assert wanted and len(wanted) < len(mutate.MUTATIONS)
    runs = []

    def run_tests(copy, tests):
        runs.append(tests)
        return len(runs) == 1  # the unmutated copy passes, every mutation is caught

    monkeypatch.setattr(mutate, "run_tests", run_tests)
    monkeypatch.setattr(mutate, "scratch_copy", copying_the_files_of(wanted))
    monkeypatch.setattr("sys.argv", ["mutate.py", "--test", "test_report_affnist.py"])
    assert mutate.main() == 0
    assert runs[1:] == [m.tests for m in wanted]
    assert f"{len(wanted)} of {len(wanted)} mutations caught" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["mutate.py", "--test", "tests/test_no_such_file.py"])
    assert mutate.main() == 2
    assert "no mutation naming a test whose id contains 'tests/test_no_such_file.py'" in capsys.readouterr().err


_PASSED_TMP: list = []  # the folder the first test below wrote in, for the second to look at


def test_a_passed_tests_tmp_path_is_written_to(tmp_path):
    """The first half of the next test: a folder with a file in it, passed."""
    (tmp_path / "weights.bin").write_bytes(bytes(1024))
    _PASSED_TMP.append(tmp_path)


def test_a_passed_tests_tmp_path_goes_at_its_end(pytestconfig):
    """A whole run wrote about 15 GB into tmp_path folders (checkpoints, DVC repositories, stores) and
    pytest keeps every one, of the last three runs, unless told: CI's machine ran out of disk so
    (2026-12-01). pyproject.toml keeps a failed test's folder only, for one run."""
    if not _PASSED_TMP:
        pytest.skip("runs after test_a_passed_tests_tmp_path_is_written_to, in the same process")
    assert not _PASSED_TMP[0].exists(), f"{_PASSED_TMP[0]} outlived its passed test"
    assert int(pytestconfig.getini("tmp_path_retention_count")) <= 1, "pytest keeps more than one run's failed folders"
