"""scripts/gpu_levers.py: the speed levers a GPU window trains with, per model: the fastest bench row whose
mode (and stack layout) every proving CUDA test passed, the fp32 twin's fastest fp32 mode, and whether
a run trained with settings its tests prove."""

import subprocess
import sys

import yaml

from conftest import REPO, script, write_profile
from gpu_device import CAPS

gpu_levers = script("gpu_levers")


def test_gpu_levers_picks_the_fastest_mode_its_cuda_tests_prove(tmp_path):
    """scripts/gpu_levers.py (gpu_session.sh --levers): per benched model, the fastest bench row of
    three stacked seeds whose mode every proving CUDA test passed; a faster mode no CUDA test proves
    (compile's own CUDA graphs), a captured mode the bench ran uncaptured, and a mode whose test
    failed are passed over; the written params file is the profile's with those levers and loads."""
    import json

    from pipeline.core.params import load_params

    params = write_profile(tmp_path / "params.gpu.yaml")

    def row(variant, mode, rate, seeds=3, stack="fused", **more):
        return {"variant": variant, "mode": mode, "seeds": seeds, "train_images_per_s": rate,
                **({"stack": stack} if seeds > 1 else {}), **more}

    rows = [row("capsnet_r3_recon", "bf16-compile", 60_000), row("capsnet_r3_recon", "bf16-compile", 90_000, seeds=1),
            row("capsnet_r3_recon", "bf16-compile-capture", 150_000, stack="bmm", captured=True),
            row("capsnet_r3_recon", "bf16-compile-capture", 120_000, captured=True),
            row("capsnet_r3_recon", "bf16-graphs", 400_000),  # faster, but no CUDA test proves it
            row("capsnet_r3_recon", "bf16-capture", 300_000, captured=False),  # fell back uncaptured
            row("baseline_cnn", "bf16", 30_000), row("baseline_cnn", "bf16-capture", 50_000, captured=True)]
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    capture = "tests/test_capture_gpu.py::test_the_captured_step_replays_what_the_eager_step_computes"
    log = "\n".join([
        "tests/test_gpu.py::test_bf16_compiled_step_matches_eager_fp32[capsnet_r3_recon] PASSED [ 1%]",
        "tests/test_gpu.py::test_compiled_bf16_stacked_training_steps_stay_finite[capsnet_r3_recon] PASSED [ 2%]",
        f"{capture}[capsnet_r3_recon-bf16-compiled-fused-3seed] PASSED [ 3%]",
        f"{capture}[capsnet_r3_recon-bf16-compiled-fused-1seed] PASSED [ 4%]",
        f"[gw3] [  5%] PASSED {capture}[capsnet_r3_recon-bf16-eager-fused-3seed] ",  # pytest-xdist's -n
        f"[gw1] [  6%] FAILED {capture}[baseline_cnn-bf16-eager-fused-3seed] ",
        f"FAILED {capture}[baseline_cnn-bf16-eager-fused-3seed] - AssertionError: grads"])
    (tmp_path / "tests.txt").write_text(log)

    def levers():
        out = subprocess.run([sys.executable, "scripts/gpu_levers.py", "--bench", str(tmp_path / "bench"), "--tests",
                              str(tmp_path / "tests.txt"), "--params", str(params)],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout
        return out, tmp_path / "params.gpu.capsnet.yaml", tmp_path / "params.gpu.baseline_cnn.yaml"

    out, capsnet, cnn = levers()
    assert "capsnet: bf16-compile-capture, stack bmm: 150,000 images/s" in out and "profile's bf16-compile-capture: 120,000" in out
    assert "baseline_cnn: bf16, stack fused: 30,000" in out and cnn.exists()
    chosen = load_params(capsnet).train
    assert (chosen.cuda_graph, chosen.compile, chosen.stack_layout, chosen.amp, chosen.epochs) == (True, True, "bmm",
                                                                                               True, 50)
    assert load_params(cnn).train.cuda_graph is False  # its capture test failed: the profile's eager bf16 wins
    # one seed faster than any proven stack (the H200: 66k alone, 31.6k three stacked): the window trains
    # seed by seed, so the one-seed rows compete, the faster bf16-compile (graphs) still unproven
    alone = [*rows, row("capsnet_r3_recon", "bf16-compile-capture", 200_000, seeds=1, captured=True),
             row("capsnet_r3_recon", "bf16-graphs", 500_000, seeds=1)]
    (tmp_path / "bench" / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in alone) + "\n")
    out, capsnet, _ = levers()
    assert "capsnet: bf16-compile-capture, stack fused: 200,000 images/s (capsnet_r3_recon, 1 seed;" in out
    (tmp_path / "bench" / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "tests.txt").write_text(log.replace("PASSED", "FAILED"))
    out, capsnet, _ = levers()
    # nothing proven, the profile's own compiled and captured step neither: eager bf16 (issue #36, item 1)
    assert "no bench mode of capsnet_r3_recon passed its CUDA tests" in out
    assert "the profile's bf16-compile-capture is not proven either" in out and "capsnet: bf16, " not in out
    chosen = load_params(capsnet).train
    assert (chosen.compile, chosen.cuda_graph, chosen.channels_last, chosen.amp) == (False, False, False, True)
    # where the profile's own mode is proven, it stays (no file), even with no other row to choose from
    (tmp_path / "bench" / "rows.jsonl").write_text(json.dumps(row("capsnet_r3_recon", "bf16-graphs", 400_000)) + "\n")
    (tmp_path / "tests.txt").write_text(log)
    out, capsnet, _ = levers()
    assert "the profile's bf16-compile-capture stays" in out and not capsnet.exists()


def test_the_fp32_twin_trains_with_the_fastest_fp32_mode_its_cuda_tests_prove(tmp_path):
    """gpu_levers for the precision check (#36 item 6): capsnet_r3_recon_fp32 reads its own levers file
    (`--key`: capsnet-fp32), chosen among fp32 rows only (a faster bf16 row is another precision, never a
    lever); its compiled captured step needs its fp32 CUDA tests, else eager fp32; a run recorded in that
    mode is checked against them (gpu_session.sh's proofs); the estimate prices the twin at the fp32 row."""
    import json

    from pipeline.core.params import load_params
    from pipeline.training.config import run_config

    params = write_profile(tmp_path / "params.gpu.yaml")
    gpu_levers, gpu_queue = script("gpu_levers"), script("gpu_queue")

    def key(variant):
        return subprocess.run([sys.executable, "scripts/gpu_levers.py", "--params", str(params), "--key", variant],
                              cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()

    assert (key("capsnet_r3_recon_fp32"), key("capsnet_r3_recon"), key("baseline_cnn")) == ("capsnet-fp32", "capsnet",
                                                                                         "baseline_cnn")
    rows = [{"variant": "capsnet_r3_recon", "mode": mode, "seeds": 1, "train_images_per_s": rate, "captured": True}
            for mode, rate in [("bf16-compile-capture", 66_000), ("fp32", 15_000), ("compile-capture", 30_000),
                               ("capture", 20_000)]]
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    capture = "tests/test_capture_gpu.py::test_the_captured_step_replays_what_the_eager_step_computes"
    proofs = [f"{capture}[capsnet_r3_recon-fp32-compiled-fused-1seed]",
              "tests/test_gpu.py::test_compiled_fp32_step_matches_eager_fp32[capsnet_r3_recon]",
              f"{capture}[capsnet_r3_recon-fp32-eager-fused-3seed]"]

    def levers(outcome):
        (tmp_path / "tests.txt").write_text("\n".join(f"{t} {outcome} [ 1%]" for t in proofs))
        out = subprocess.run([sys.executable, "scripts/gpu_levers.py", "--bench", str(tmp_path / "bench"), "--tests",
                              str(tmp_path / "tests.txt"), "--params", str(params)],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout
        return out, load_params(tmp_path / "params.gpu.capsnet-fp32.yaml")

    out, twin = levers("PASSED")
    assert "capsnet-fp32 (fp32 twin) — capsnet: compile-capture, stack fused: 30,000 images/s" in out
    assert (twin.train.compile, twin.train.cuda_graph, twin.train.amp) == (True, True, True)  # amp: the profile's
    assert run_config(twin, "capsnet_r3_recon_fp32", 0).amp is False  # the twin's own precision still wins

    recorded = {"config": {"model": "capsnet", "amp": False, "compile": True, "compile_mode": "default",
                           "channels_last": False, "cuda_graph": True}}
    passed = gpu_levers.test_outcomes((tmp_path / "tests.txt").read_text())
    assert gpu_levers.run_unproven(recorded, passed) == ""
    raw = yaml.safe_load((tmp_path / "params.gpu.capsnet-fp32.yaml").read_text())
    assert gpu_queue.trained_rows(raw, "capsnet_r3_recon_fp32", rows)[1] == [rows[2]]  # priced at the fp32 row
    assert gpu_queue.trained_rows(raw, "capsnet_r3_recon", rows)[1] == [rows[0]]  # the same levers, in bf16
    out, twin = levers("FAILED")
    assert "capsnet-fp32 (fp32 twin) — capsnet: fp32, stack fused: 15,000 images/s" in out
    assert (twin.train.compile, twin.train.cuda_graph) == (False, False)  # eager fp32
    assert "FAILED" in gpu_levers.run_unproven(recorded, gpu_levers.test_outcomes((tmp_path / "tests.txt").read_text()))


def test_gpu_levers_count_only_a_passed_proof_and_write_what_each_choice_trains_with(tmp_path):
    """scripts/gpu_levers.py: a proving CUDA test that was skipped proves nothing (a streams row refused, and
    counted among the modes not proven); pytest-xdist's lines count; a CNN given a compiled mode compiles
    (compile_cnns); the fp32 twin never takes a bf16 row, and with no fp32 row falls back to eager fp32 in
    the fused layout, whatever layout the profile stacks in; --check-run fails a run whose settings no
    passed test proves, naming it, and a missing params file is one line naming the command that writes it."""
    import json

    from pipeline.core.params import load_params

    params = write_profile(tmp_path / "params.gpu.yaml")
    raw = yaml.safe_load(params.read_text())
    raw["train"]["stack_layout"] = "streams"
    params.write_text(yaml.safe_dump(raw, sort_keys=False))

    def row(variant, mode, rate, seeds=3, stack="fused"):
        return {"variant": variant, "mode": mode, "seeds": seeds, "train_images_per_s": rate, "captured": True,
                **({"stack": stack} if seeds > 1 else {})}

    rows = [row("capsnet_r3_recon", "bf16-compile-capture", 150_000, stack="streams"),
            row("capsnet_r3_recon", "bf16-compile", 60_000), row("capsnet_r3_recon", "bf16-cl", 10_000, seeds=1),
            row("baseline_cnn", "bf16-compile", 80_000), row("baseline_cnn", "bf16", 30_000)]
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    capture = "tests/test_capture_gpu.py::test_the_captured_step_replays_what_the_eager_step_computes"
    (tmp_path / "tests.txt").write_text("\n".join([
        "[gw0] [ 1%] PASSED tests/test_gpu.py::test_bf16_compiled_step_matches_eager_fp32[capsnet_r3_recon]",
        "[gw1] [ 2%] PASSED tests/test_gpu.py::test_compiled_bf16_stacked_training_steps_stay_finite[capsnet_r3_recon]",
        "tests/test_gpu.py::test_bf16_compiled_step_matches_eager_fp32[baseline_cnn] PASSED [ 3%]",
        "tests/test_gpu.py::test_compiled_bf16_stacked_training_steps_stay_finite[baseline_cnn] PASSED [ 4%]",
        f"{capture}[capsnet_r3_recon-bf16-compiled-fused-3seed] PASSED [ 5%]",
        f"{capture}[capsnet_r3_recon-bf16-compiled-streams-3seed] SKIPPED [ 6%]"]))

    def levers(*args):
        return subprocess.run([sys.executable, "scripts/gpu_levers.py", "--tests", str(tmp_path / "tests.txt"), *args],
                              cwd=REPO, capture_output=True, text=True)

    out = levers("--bench", str(tmp_path / "bench"), "--params", str(params)).stdout
    assert "capsnet: bf16-compile, stack fused: 60,000 images/s (capsnet_r3_recon, 3 seeds; 1 mode(s) not proven" in out
    cnn = load_params(tmp_path / "params.gpu.baseline_cnn.yaml").train
    assert (cnn.compile, cnn.compile_cnns) == (True, True)  # the CNN trains the compiled mode it was picked for
    twin = load_params(tmp_path / "params.gpu.capsnet-fp32.yaml").train
    assert (twin.compile, twin.cuda_graph, twin.stack_layout) == (False, False, "fused")
    assert "capsnet-fp32 (fp32 twin) — " in out and out.split("capsnet-fp32 (fp32 twin) — ")[1].split("\n")[0].endswith(
        ": fp32, eager")  # its own precision's eager mode
    captured = {"model": "capsnet", "amp": True, "compile": True, "compile_mode": "default", "channels_last": False,
                "cuda_graph": True, "stack_layout": "streams"}
    streams = {"config": captured, "stacked_seeds": [0, 1, 2]}
    (tmp_path / "run.json").write_text(json.dumps(streams))
    refused = levers("--check-run", str(tmp_path / "run.json"))
    assert refused.returncode == 1 and refused.stderr.strip().endswith("-streams-3seed] SKIPPED")
    fused = {**captured, "cuda_graph": False, "stack_layout": "fused"}
    (tmp_path / "run.json").write_text(json.dumps({**streams, "config": fused}))
    assert levers("--check-run", str(tmp_path / "run.json")).returncode == 0
    missing = tmp_path / "absent.yaml"
    absent = levers("--params", str(missing))
    assert absent.returncode == 1
    writes = f"python -m pipeline.profiles gpu --write {missing}"
    assert absent.stderr == f"{missing} does not exist: write it with `{writes}`\n"


def test_gpu_levers_write_a_channels_last_pick_and_read_no_row_of_another_seed_count(tmp_path):
    """scripts/gpu_levers.py: a channels-last mode picked is written as channels_last; rows of a seed count
    the window never trains in one process (two) neither compete nor stop the choice (a model with only
    those falls back, no traceback); a proof reported failed and then passed (two logs, one file) is failed."""
    import json

    from pipeline.core.params import load_params

    params = write_profile(tmp_path / "params.gpu.yaml")
    rows = [{"variant": "capsnet_r3_recon", "mode": "bf16-cl", "seeds": 3, "stack": "fused", "train_images_per_s": 100_000},
            {"variant": "capsnet_r3_recon", "mode": "bf16-compile", "seeds": 3, "stack": "fused", "train_images_per_s": 200_000},
            {"variant": "capsnet_r3_recon", "mode": "bf16-compile", "seeds": 2, "stack": "fused", "train_images_per_s": 900_000},
            {"variant": "baseline_cnn", "mode": "bf16", "seeds": 2, "stack": "fused", "train_images_per_s": 50_000}]
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    compiled = "tests/test_gpu.py::test_bf16_compiled_step_matches_eager_fp32[capsnet_r3_recon]"
    (tmp_path / "tests.txt").write_text("\n".join([
        "tests/test_gpu.py::test_bf16_channels_last_step_matches_eager_fp32[capsnet_r3_recon] PASSED [ 1%]",
        f"{compiled} FAILED [ 2%]",
        "tests/test_gpu.py::test_compiled_bf16_stacked_training_steps_stay_finite[capsnet_r3_recon] PASSED [ 3%]",
        f"[gw0] [ 50%] PASSED {compiled}"]))
    out = subprocess.run([sys.executable, "scripts/gpu_levers.py", "--bench", str(tmp_path / "bench"), "--tests",
                          str(tmp_path / "tests.txt"), "--params", str(params)],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "capsnet: bf16-cl, stack fused: 100,000 images/s (capsnet_r3_recon, 3 seeds; 1 mode(s) not proven" in out
    chosen = load_params(tmp_path / "params.gpu.capsnet.yaml").train
    assert (chosen.channels_last, chosen.compile, chosen.cuda_graph, chosen.amp) == (True, False, False, True)
    assert "baseline_cnn: no bench row of baseline_cnn in a proven mode at the profile's precision" in out


def test_seeds_side_by_side_on_streams_need_their_own_cuda_test(gpu_params):
    """The streams layout (stacked seeds each on a CUDA stream of its own) is picked only where its own
    capture test passed beside its mode's (gpu_levers.LAYOUT_PROOFS: the captured step in streams against
    the eager loop, at the mode's precision, compiled or eager); a run trained in it, seeds stacked, is
    checked against that test; one seed alone in it, or the other layouts, need no more than the mode's."""
    capture = "test_capture_gpu.py::test_the_captured_step_replays_what_the_eager_step_computes"
    mode_proofs = {f"{capture}[capsnet_r3_recon-bf16-compiled-fused-1seed]": "PASSED",
                   "test_gpu.py::test_compiled_bf16_stacked_training_steps_stay_finite[capsnet_r3_recon]": "PASSED"}
    streams_proof = {f"{capture}[capsnet_r3_recon-bf16-compiled-streams-3seed]": "PASSED"}
    eager_streams = {f"{capture}[capsnet_r3_recon-bf16-eager-streams-3seed]": "PASSED"}  # another mode's
    stacked = [{"variant": "capsnet_r3_recon", "mode": CAPS, "seeds": 3, "stack": stack, "captured": True,
                "train_images_per_s": rate} for stack, rate in (("streams", 140_000.0), ("fused", 31_000.0))]
    one = {"variant": "capsnet_r3_recon", "mode": CAPS, "seeds": 1, "captured": True, "train_images_per_s": 66_000.0}
    train = gpu_levers.variant_train(gpu_params, "capsnet_r3_recon")
    picked, line = gpu_levers.choose([*stacked, one], {**mode_proofs, **streams_proof}, train, "capsnet")
    assert picked["stack_layout"] == "streams" and "140,000 images/s" in line, line
    picked, line = gpu_levers.choose([*stacked, one], {**mode_proofs, **eager_streams}, train, "capsnet")
    assert picked["stack_layout"] == "fused" and "1 seed" in line, line  # streams unproven: one seed at 66k beats 31k
    assert gpu_levers.proven(CAPS, "capsnet_r3_recon", mode_proofs, "loop") == (True, "")
    assert gpu_levers.proven(CAPS, "capsnet_r3_recon", mode_proofs, "streams")[1] == \
        f"{capture}[capsnet_r3_recon-bf16-compiled-streams… did not run"

    def run(stack_layout, seeds):
        return {"config": {"model": "capsnet", "amp": True, "compile": True, "compile_mode": "default",
                           "channels_last": False, "cuda_graph": True, "stack_layout": stack_layout},
                "stacked_seeds": list(range(seeds))}

    assert "streams" in gpu_levers.run_unproven(run("streams", 3), mode_proofs)
    assert gpu_levers.run_unproven(run("streams", 3), {**mode_proofs, **streams_proof}) == ""
    assert gpu_levers.run_unproven(run("streams", 1), mode_proofs) == ""  # one seed: the loop of one
    assert gpu_levers.run_unproven(run("fused", 3), mode_proofs) == ""
