import re
import shutil
from pathlib import Path

import pytest
import torchvision
from click.testing import CliRunner
from torchvision.transforms import v2

from conftest import REPO, trust_mnist, write_mnist
from pipeline.cli import main


def test_torchvision_imports_and_runs_a_transform():
    import torch

    image = torch.zeros(1, 28, 28, dtype=torch.uint8)
    image[0, 10:18, 12:16] = 255
    out = v2.RandomAffine(degrees=20, translate=(0.1, 0.1))(image)
    assert out.shape == image.shape and torchvision.__version__
    assert torchvision.ops.nms(torch.tensor([[0.0, 0, 1, 1]]), torch.tensor([1.0]), 0.5).tolist() == [0]


def test_help_lists_the_stages():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for command in ("download", "prepare"):
        assert command in result.output


def test_download_and_prepare_through_the_cli(synthetic_mnist, tmp_path, monkeypatch):
    mirror, files = synthetic_mnist
    monkeypatch.setenv("CAPSNET_MNIST_MIRROR", mirror.as_uri())
    runner = CliRunner()
    raw = tmp_path / "raw"
    result = runner.invoke(main, ["download", str(raw)])
    assert result.exit_code == 0, result.output
    assert "t10k-labels-idx1-ubyte" in result.output
    params = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", params)
    fig = tmp_path / "fig"
    result = runner.invoke(main, ["prepare", str(raw), str(tmp_path / "prepared"), "--figures", str(fig),
                                  "--params", str(params)])
    assert result.exit_code == 0, result.output
    for montage in ("affine_montage.png", "affnist_montage.png"):  # what dvc.yaml lists as prepare's outputs
        assert (fig / montage).read_bytes()[:4] == b"\x89PNG"
    for split in ("train", "test", "affine_test", "expanded_test", "affnist_test", "multimnist_test"):
        assert (tmp_path / "prepared" / f"{split}.safetensors").is_file()
    assert "affNIST-style set (generated: 32 transform(s)" in result.output  # the committed params: 32 per digit


def test_a_broken_affnist_mirror_stops_prepare_with_its_name(tmp_path, monkeypatch):
    raw = tmp_path / "raw"
    trust_mnist(monkeypatch, write_mnist(raw))
    monkeypatch.setenv("CAPSNET_AFFNIST_MIRROR", str(tmp_path / "no-such-affnist"))
    result = CliRunner().invoke(main, ["prepare", str(raw), str(tmp_path / "prepared"), "--figures", str(tmp_path / "fig"), "--params", str(REPO / "params.yaml")])
    assert result.exit_code == 1 and "CAPSNET_AFFNIST_MIRROR" in result.output and "no-such-affnist" in result.output
    assert not (tmp_path / "prepared" / "affnist_test.safetensors").exists()  # no §5.2 set half-written


def test_download_failure_is_a_clean_error(tmp_path, monkeypatch):
    from pipeline.data import download

    monkeypatch.setattr(download, "default_sources", lambda: [str(tmp_path / "missing")])
    result = CliRunner().invoke(main, ["download", str(tmp_path / "raw")])
    assert result.exit_code == 1 and "CAPSNET_MNIST_MIRROR" in result.output


@pytest.mark.parametrize("command, missing, maker", [
    (["prepare", "{gone}", "{tmp}/out", "--figures", "{tmp}/fig"], "RAW_DIR", "`capsnet download RAW_DIR`"),
    (["train", "capsnet_r1", "0", "{gone}", "{tmp}/m", "--checkpoint", "{tmp}/c.pt"], "DATA_DIR", "`dvc repro prepare`"),
    (["evaluate", "{gone}", "{tmp}", "{tmp}/r"], "MODEL_DIR", "the train stages"),
    (["evaluate", "{tmp}", "{gone}", "{tmp}/r"], "DATA_DIR", "`dvc repro prepare`"),
    (["report", "{tmp}", "{gone}", "{tmp}/o"], "RESULTS_DIR", "the evaluate stages"),
    (["publish", "{gone}", "{tmp}", "{tmp}/o"], "MODELS_DIR", "the train stages")])
def test_a_missing_input_folder_names_what_makes_it(tmp_path, command, missing, maker):
    """A stage's input folder that is not there yet: one line naming it and the step that makes it,
    whose `capsnet` commands exist."""
    args = [a.format(gone=tmp_path / "gone", tmp=tmp_path) for a in command]
    result = CliRunner().invoke(main, args)
    line = result.output.strip().splitlines()[-1]
    assert result.exit_code == 2 and line.startswith(f"Error: Invalid value for '{missing}'"), result.output
    assert f"{tmp_path / 'gone'}' does not exist: {maker}" in line
    assert set(re.findall(r"`capsnet (\w+)", line)) <= set(main.commands)


def test_bad_params_stop_prepare_before_work(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text((REPO / "params.yaml").read_text().replace("max_shear: 0.2", "max_shear: 0.2\n  nonsense: 1"))
    (tmp_path / "raw").mkdir()
    result = CliRunner().invoke(main, ["prepare", str(tmp_path / "raw"), str(tmp_path / "out"),
                                       "--figures", str(tmp_path / "fig"),
                                       "--params", str(params)])
    assert result.exit_code == 1 and "unknown key prepare.nonsense" in result.output
    assert not (tmp_path / "out").exists()


def test_bench_modes_of_the_cli_are_the_benchs():
    from pipeline.training import bench
    from pipeline import cli

    assert cli.BENCH_MODES == list(bench.MODES)


def test_bench_prints_one_json_line_per_configuration():
    import json

    result = CliRunner().invoke(main, ["bench", "--variant", "capsnet_r1", "--batch", "4", "--steps", "1",
                                       "--warmup", "1", "--device", "cpu", "--mode", "fp32", "--mode", "bf16",
                                       "--params", str(REPO / "params.yaml")])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert [r["mode"] for r in rows] == ["reference", "fp32", "bf16"]
    assert rows[1]["deterministic"] is True  # params.yaml's setting, timed as the profile trains
    ours = rows[1]
    assert ours["train_images_per_s"] > 0 and ours["inference_images_per_s"] > 0
    assert ours["speedup_vs_reference"] > 0
    # FLOP counted over one training step: > forward-only estimate of conv1+primary+u_hat (~0.39 GFLOP)
    assert 0.39e9 * 2 < ours["flop_per_image_train"] < 0.39e9 * 6


def test_bench_without_warmup_times_the_first_step_and_refuses_no_steps():
    import json

    args = ["bench", "--variant", "capsnet_r1", "--batch", "2", "--device", "cpu", "--no-reference",
            "--params", str(REPO / "params.yaml")]
    result = CliRunner().invoke(main, [*args, "--steps", "1", "--warmup", "0"])
    assert result.exit_code == 0, result.output
    (row,) = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert row["first_step_s"] is None and row["ms_per_step"] > 0
    refused = CliRunner().invoke(main, [*args, "--steps", "0"])
    assert refused.exit_code == 2 and "'--steps': 0 is not in the range x>=1" in refused.output


def test_prepare_refuses_a_raw_file_changed_after_download(tmp_path, monkeypatch):
    raw = tmp_path / "raw"
    trust_mnist(monkeypatch, write_mnist(raw))
    images = raw / "t10k-images-idx3-ubyte"
    data = bytearray(images.read_bytes())
    data[-1] ^= 0xFF  # one pixel byte: still a valid IDX file, silently wrong without the hash check
    images.write_bytes(bytes(data))
    result = CliRunner().invoke(main, ["prepare", str(raw), str(tmp_path / "prepared"), "--figures", str(tmp_path / "fig"), "--params", str(REPO / "params.yaml")])
    assert result.exit_code == 1 and result.output.count("\n") == 1  # one line, no traceback
    assert "t10k-images-idx3-ubyte changed after download" in result.output and "dvc repro -f download" in result.output
    assert not (tmp_path / "prepared").exists()


def test_prepare_names_a_missing_raw_file_and_an_undecodable_one_in_one_line(tmp_path, monkeypatch):
    """A raw file that is not there says how to fetch it; one whose hash matches but that is no IDX file
    (a truncated download trusted, say) says what is wrong with it and how to fetch it clean."""
    raw = tmp_path / "raw"
    files = write_mnist(raw)
    (raw / "train-labels-idx1-ubyte").unlink()
    trust_mnist(monkeypatch, files)
    args = [str(raw), str(tmp_path / "prepared"), "--figures", str(tmp_path / "fig"), "--params", str(REPO / "params.yaml")]
    missing = CliRunner().invoke(main, ["prepare", *args])
    assert missing.exit_code == 1 and missing.output.count("\n") == 1
    assert "train-labels-idx1-ubyte is missing" in missing.output and "dvc repro download" in missing.output
    files["train-labels-idx1-ubyte"] = b"\x00\x00\x08\x01"  # an IDX header and no length
    (raw / "train-labels-idx1-ubyte").write_bytes(files["train-labels-idx1-ubyte"])
    trust_mnist(monkeypatch, files)
    broken = CliRunner().invoke(main, ["prepare", *args])
    assert broken.exit_code == 1 and broken.output.count("\n") == 1
    assert "train-labels-idx1-ubyte: truncated header" in broken.output and "dvc repro -f download" in broken.output
    assert not [path for path in (tmp_path / "prepared").rglob("*") if path.is_file()]


def test_train_reads_its_seeds_and_gives_each_seed_its_own_directory(tmp_path, monkeypatch):
    """SEEDS is one seed, several (stacked) or all (params.yaml's ablation.seeds); text, a repeated or
    negative seed, or several seeds into one directory is a usage error (status 2) before anything
    trains. Each seed's directory is OUT_DIR with {seed} filled in, and each seed's line says where it
    stopped early."""
    from types import SimpleNamespace

    from pipeline.stages import train as train_stage

    calls = []

    def run_group(params, variant, seeds, data_dir, out_dirs, checkpoint):
        calls.append((variant, seeds, out_dirs))
        return [SimpleNamespace(cfg=SimpleNamespace(seed=s), history=[{"test_error_pct": 0.5 + s}] * (3 if s else 5),
                                stop_reason="target" if s else "epochs", eval_set="test") for s in seeds]

    monkeypatch.setattr(train_stage, "run_group", run_group)
    (tmp_path / "data").mkdir()

    def train(seeds: str, out: str):
        return CliRunner().invoke(main, ["train", "capsnet_r1", seeds, str(tmp_path / "data"), out, "--checkpoint",
                                         str(tmp_path / "c.pt"), "--params", str(REPO / "params.yaml")])

    each = str(tmp_path / "m" / "seed{seed}")
    result = train("0,2", each)
    assert result.exit_code == 0, result.output
    assert calls == [("capsnet_r1", [0, 2], [tmp_path / "m" / "seed0", tmp_path / "m" / "seed2"])]
    assert result.output.splitlines() == [
        f"capsnet_r1 seed 0: final test error 0.50% -> {tmp_path / 'm' / 'seed0'}",
        f"capsnet_r1 seed 2: final test error 2.50%, early stop at epoch 3 -> {tmp_path / 'm' / 'seed2'}"]
    assert train("all", each).exit_code == 0 and calls[-1][1] == [0, 1, 2]  # the committed ablation.seeds
    for seeds, out, message in (("0,x", each, "'0,x': give a seed (0), comma-separated seeds (0,1,2) or all"),
                                ("1,1", each, "'1,1': seeds are distinct integers >= 0"),
                                ("0,-1", each, "'0,-1': seeds are distinct integers >= 0"),
                                ("0,1", str(tmp_path / "m"), "with several seeds, name each seed's directory with "
                                                             "{seed}")):
        result = train(seeds, out)
        assert result.exit_code == 2 and message in result.output, (seeds, result.output)
    assert len(calls) == 2  # nothing trained on a usage error


def test_evaluate_needs_no_params_but_names_the_train_stage_where_they_load(tmp_path):
    """A model folder without its config: the hint names the train stage params.yaml's ablation makes;
    where --params does not load, evaluation (which needs none) still gives its own error, with the
    command that lists every stage instead of params.yaml's complaint."""
    model = tmp_path / "models" / "capsnet_r1" / "seed0"
    model.mkdir(parents=True)
    (tmp_path / "data").mkdir()
    for params, hint in ((REPO / "params.yaml", "retrain it with `dvc repro -f train_stacked@capsnet_r1`"),
                         (tmp_path / "none.yaml", "retrain it with the train stage of capsnet_r1 seed 0 (`capsnet "
                                                  "stages --kind stages` lists every stage)")):
        result = CliRunner().invoke(main, ["evaluate", str(model), str(tmp_path / "data"), str(tmp_path / "out"),
                                           "--params", str(params)])
        assert result.exit_code == 1 and f"config.json is missing; {hint}" in result.output, result.output


def test_fingerprint_of_an_unknown_variant_is_one_line_before_any_work(tmp_path):
    result = CliRunner().invoke(main, ["fingerprint", str(tmp_path / "table.json"), "--variant", "capsnet_r9",
                                       "--params", str(REPO / "params.yaml")])
    assert result.exit_code == 1 and "Error: unknown variant 'capsnet_r9'; params.yaml defines [" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "table.json").exists()


def test_fingerprint_computes_every_variant_by_default_and_refuses_an_unknown_one_before_any(tmp_path, monkeypatch):
    """Without --variant every variant of params.yaml, in its order, with the commit and the environment
    the fingerprints were computed in; an unknown name among several stops the command before any
    fingerprint is computed (each costs seconds of a CPU)."""
    import json

    from pipeline.core.params import load_params
    from pipeline.training import fingerprint

    asked = []
    monkeypatch.setattr(fingerprint, "fingerprint_table",
                        lambda params, names, progress: asked.append(list(names)) or dict.fromkeys(names, "f"))
    done = CliRunner().invoke(main, ["fingerprint", str(tmp_path / "all.json"), "--params", str(REPO / "params.yaml")])
    every = list(load_params(REPO / "params.yaml").variants)
    assert done.exit_code == 0 and asked == [every], done.output
    written = json.loads((tmp_path / "all.json").read_text())
    assert sorted(written["fingerprints"]) == sorted(every) and written["environment"] and written["commit"]
    refused = CliRunner().invoke(main, ["fingerprint", str(tmp_path / "two.json"), "--variant", "capsnet_r1",
                                        "--variant", "capsnet_r9", "--params", str(REPO / "params.yaml")])
    assert refused.exit_code == 1 and "unknown variant 'capsnet_r9'" in refused.output and asked == [every]


def test_evaluate_says_each_error_rate_it_measured_and_where_it_wrote_them(tmp_path, monkeypatch):
    """The line `capsnet evaluate` ends with: the clean test error, the transformed one where the
    experiment has a transformed set (MultiMNIST has none), the output folder."""
    from pipeline.stages import evaluate as evaluate_stage

    for folder in ("model", "data"):
        (tmp_path / folder).mkdir()
    args = ["evaluate", str(tmp_path / "model"), str(tmp_path / "data"), str(tmp_path / "out")]
    for metrics, said in (({"error_pct": 0.5, "transformed_error_pct": 12.25}, "0.50%, transformed test error 12.25%"),
                          ({"error_pct": 5.0}, "5.00%")):
        monkeypatch.setattr(evaluate_stage, "run", lambda *args, metrics=metrics: metrics)
        result = CliRunner().invoke(main, args)
        assert result.output == f"{tmp_path / 'model'}: test error {said} -> {tmp_path / 'out'}\n", result.output


def test_report_hands_the_stage_each_option_it_was_given_and_prints_the_claims(tmp_path, monkeypatch):
    """`capsnet report`'s folders, --missing, --readme, --benchmarks and --fingerprints reach the
    report stage as given (not their defaults), and its claims follow the line naming the report."""
    from pipeline.stages import report as report_stage

    seen = []
    monkeypatch.setattr(report_stage, "run", lambda *args: seen.append(args[1:]) or Path(args[3]) / "ablation.md")
    monkeypatch.setattr(report_stage, "claims_summary", lambda out, profile: ["Table 1: a claim"])
    for folder in ("models", "results"):
        (tmp_path / folder).mkdir()
    (tmp_path / "README.md").write_text("")
    paths = {name: tmp_path / name for name in ("models", "results", "out", "README.md", "speeds.md", "tables")}
    result = CliRunner().invoke(main, ["report", *map(str, [paths["models"], paths["results"], paths["out"]]),
                                       "--missing", "list", "--readme", str(paths["README.md"]),
                                       "--benchmarks", str(paths["speeds.md"]), "--fingerprints", str(paths["tables"]),
                                       "--params", str(REPO / "params.yaml")])
    assert result.exit_code == 0, result.output
    assert seen == [(paths["models"], paths["results"], paths["out"], "list", paths["README.md"], paths["speeds.md"],
                     paths["tables"])]
    assert result.output == f"report written to {paths['out'] / 'ablation.md'}\nTable 1: a claim\n"


def test_bench_hands_the_bench_each_option_it_was_given_and_its_defaults_otherwise(monkeypatch):
    """`capsnet bench`'s options reach pipeline.training.bench.run as given (every repeatable one in its
    order), and without them the defaults its help shows: params.yaml decides determinism."""
    from pipeline.training import bench as bn

    seen = []
    monkeypatch.setattr(bn, "run", lambda params, *args: seen.append(args) or [{"row": len(seen)}])
    given = ["--variant", "baseline_cnn", "--batch", "64", "--batch", "256", "--mode", "bf16", "--mode", "bf16-capture",
             "--steps", "7", "--warmup", "2", "--no-reference", "--deterministic", "off", "--device", "cpu",
             "--seeds", "1", "--seeds", "3", "--stack", "bmm", "--stack", "loop", "--profile-steps", "4"]
    for args in (given, []):
        result = CliRunner().invoke(main, ["bench", *args, "--params", str(REPO / "params.yaml")])
        assert result.exit_code == 0, result.output
        assert result.output == f'{{"row": {len(seen)}}}\n'  # each row one JSON line
    assert seen == [("baseline_cnn", (64, 256), ("bf16", "bf16-capture"), 7, 2, False, "off", "cpu", (1, 3),
                     ("bmm", "loop"), 4),
                    ("capsnet_r3_recon", (128,), ("fp32",), 20, 3, True, "params", "auto", (1,), ("fused",), 0)]


def test_publish_of_folders_without_a_complete_run_is_an_error_not_an_empty_copy(tmp_path):
    for folder in ("models", "results/capsnet_r1/seed0"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "results" / "capsnet_r1" / "seed0" / "metrics.json").write_text("{}")  # no predictions, no config
    result = CliRunner().invoke(main, ["publish", str(tmp_path / "models"), str(tmp_path / "results"),
                                       str(tmp_path / "dest")])
    assert result.exit_code == 1, result.output
    assert f"Error: {tmp_path / 'results'} holds no complete run (metrics.json + predictions + config)" in result.output


def test_evaluate_of_a_torn_model_folder_names_the_file_and_the_stage_that_remakes_it(tmp_path):
    """Torn or foreign config.json, torn weights: one line naming the file and the train stage that
    remakes it, before any data is read."""
    import dataclasses
    import json

    from pipeline.core.params import load_params
    from pipeline.training.config import run_config

    model = tmp_path / "models" / "capsnet_r1" / "seed0"
    model.mkdir(parents=True)
    (tmp_path / "data").mkdir()
    config = {"config": dataclasses.asdict(run_config(load_params(REPO / "params.yaml"), "capsnet_r1", 0))}
    for config_text, weights, message in (
            ("{torn", None, f"{model / 'config.json'} is not a train stage's config"),
            ('{"run_id": "r"}', None, f"{model / 'config.json'} is not a train stage's config ('config')"),
            (json.dumps(config), b"\x00" * 5, f"{model / 'model.safetensors'} is truncated or corrupt")):
        (model / "config.json").write_text(config_text)
        if weights:
            (model / "model.safetensors").write_bytes(weights)
        result = CliRunner().invoke(main, ["evaluate", str(model), str(tmp_path / "data"), str(tmp_path / "out"),
                                           "--params", str(REPO / "params.yaml")])
        assert result.exit_code == 1 and message in result.output, result.output
        assert "; retrain it with `dvc repro -f train_stacked@capsnet_r1`" in result.output
