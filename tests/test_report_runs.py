"""The run records the report reads (on fabricated runs): what each run recorded and what it did not,
provenance, resumes and schedules, the published copies and what publishing takes or sets aside."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from report_runs import COMMIT, REFERENCE, edit_record, fabricate, fabricate_cnn_affnist, load, markdown
from pipeline.core import protocol
from pipeline.experiments import affnist_report as ra
from pipeline.experiments import table1_report as t1
from pipeline.report import document as rp
from pipeline.report import publish
from pipeline.report import runs as rr
from pipeline.report.rows import group
from pipeline.training.config import ADAM_EPS


def test_published_copies_rewrite_the_same_report_without_scores(tmp_path):
    for seed in (0, 1):
        fabricate(tmp_path, "capsnet_r1", seed, 1.5 + seed)
        fabricate(tmp_path, "capsnet_r3", seed, 1.0)
    result = tmp_path / "results" / "capsnet_r3" / "seed0"
    extra = {"test_scores": torch.rand(200, 10).half()}
    from safetensors.torch import load_file
    save_file({**load_file(str(result / "predictions.safetensors")), **extra}, str(result / "predictions.safetensors"))
    (tmp_path / "results" / "capsnet_r1" / "seed2").mkdir(parents=True)  # incomplete: not published
    copied = publish.publish_runs(tmp_path / "models", tmp_path / "results", tmp_path / "pub")
    assert copied == [("capsnet_r1", 0), ("capsnet_r1", 1), ("capsnet_r3", 0), ("capsnet_r3", 1)]
    kept = load_file(str(tmp_path / "pub" / "results" / "capsnet_r3" / "seed0" / "predictions.safetensors"))
    assert sorted(kept) == ["affine_test_labels", "affine_test_preds", "test_labels", "test_preds"]
    original = load(tmp_path, ["capsnet_r1", "capsnet_r3"], [0, 1])
    published = rr.load_runs(tmp_path / "pub" / "models", tmp_path / "pub" / "results", ["capsnet_r1", "capsnet_r3"], [0, 1])
    pd.testing.assert_frame_equal(t1.effects(original, REFERENCE), t1.effects(published, REFERENCE))
    pd.testing.assert_frame_equal(t1.summarize(original, REFERENCE), t1.summarize(published, REFERENCE))


def test_published_predictions_keep_only_per_image_labels_predictions_and_source_digits(tmp_path):
    """A per-image score that is not a prediction, and MultiMNIST's (P, 2) pairs, stay out of git."""
    from safetensors.torch import load_file

    fabricate(tmp_path, "capsnet_r1", 0, 1.0)
    path = tmp_path / "results" / "capsnet_r1" / "seed0" / "predictions.safetensors"
    extra = {"test_margin": torch.rand(200), "pair_labels": torch.zeros(200, 2, dtype=torch.uint8)}
    save_file(load_file(str(path)) | extra, str(path))
    publish.publish_runs(tmp_path / "models", tmp_path / "results", tmp_path / "pub")
    kept = load_file(str(tmp_path / "pub" / "results" / "capsnet_r1" / "seed0" / "predictions.safetensors"))
    assert sorted(kept) == ["affine_test_labels", "affine_test_preds", "test_labels", "test_preds"]
    narrowed = [publish.narrowest(torch.tensor(v, dtype=torch.int64)).dtype for v in ([], [-40_000], [2 ** 40])]
    assert narrowed == [torch.int16, torch.int32, torch.int64]  # an empty index, one below int16, one past int32


def test_published_source_digits_are_narrowed_and_read_back_as_the_same_groups(tmp_path):
    """The affNIST-style set's source-digit indices are published in the narrowest integer type that
    holds them (every GPU call carries reports/runs: 0.64 MB a run, not 1.28), and the §5.2 gap, whose
    interval resamples whole source digits, comes out of the published copies as out of the originals."""
    from safetensors.torch import load_file
    for seed in (0, 1):
        fabricate(tmp_path, "capsnet_affnist", seed, 1.0, n=400, affine_pct=21.0 + seed, image_size=40)
        fabricate_cnn_affnist(tmp_path, seed, n=400, affine_pct=36.0 - seed)
    for path in sorted(tmp_path.glob("results/*/seed*/predictions.safetensors")):
        pred = load_file(str(path))
        save_file(pred | {"affnist_test_digit_index": torch.arange(100, dtype=torch.int32).repeat_interleave(4)}, str(path))
    publish.publish_runs(tmp_path / "models", tmp_path / "results", tmp_path / "pub")
    kept = load_file(str(tmp_path / "pub" / "results" / "capsnet_affnist" / "seed0" / "predictions.safetensors"))
    assert kept["affnist_test_digit_index"].dtype == torch.int16
    variants = ["capsnet_affnist", "cnn_affnist"]
    original, published = load(tmp_path, variants, [0, 1]), rr.load_runs(tmp_path / "pub" / "models",
                                                                          tmp_path / "pub" / "results", variants, [0, 1])
    assert published[0].digit_index["affnist_test"].dtype == np.int64
    assert ra.affnist_gap(published, REFERENCE) == ra.affnist_gap(original, REFERENCE)
    grouped = ra.affnist_gap(original, REFERENCE)
    for path in sorted(tmp_path.glob("results/*/seed*/predictions.safetensors")):  # the same runs, images not grouped
        pred = load_file(str(path))
        del pred["affnist_test_digit_index"]
        save_file(pred, str(path))
    assert ra.affnist_gap(load(tmp_path, variants, [0, 1]), REFERENCE)["ci_low"] != grouped["ci_low"]  # the groups count
    assert [publish.narrowest(torch.tensor(v)).dtype for v in ([0, 32767], [-1, 40000], [0, 2**31])] == \
        [torch.int16, torch.int32, torch.int64]


def test_a_seed_trained_again_sets_its_published_record_aside_and_the_report_keeps_both(tmp_path):
    first, again, pub = tmp_path / "first", tmp_path / "again", tmp_path / "pub"
    for seed in (0, 1):
        fabricate(first, "capsnet_r3", seed, 1.0, commit="17bb48c")
    fabricate(again, "capsnet_r3", 0, 0.5, commit="b8f3efe", lr_schedule_epochs=640)
    edit_record(again, "capsnet_r3", 0, lambda record: record.update(run_id="again-0"))
    for _ in range(2):  # publishing the same runs again replaces their records in place
        publish.publish_runs(first / "models", first / "results", pub)
    assert not (pub / "earlier").exists()
    assert publish.publish_runs(again / "models", again / "results", pub) == [("capsnet_r3", 0)]
    assert json.loads((pub / "models" / "capsnet_r3" / "seed0" / "config.json").read_text())["run_id"] == "again-0"
    aside = pub / "earlier" / "capsnet_r3-0"
    assert (aside / "results" / "capsnet_r3" / "seed0" / "predictions.safetensors").is_file()
    current = rr.load_runs(pub / "models", pub / "results", ["capsnet_r3"], [0, 1])
    runs = publish.with_earlier(current, pub / "models", ["capsnet_r3"], [0, 1])
    assert [(r.seed, r.commit, r.metrics["error_pct"]) for r in runs] == [(0, "17bb48c", 1.0), (0, "b8f3efe", 0.5), (1, "17bb48c", 1.0)]
    assert [[r.seed for r in row] for row in group(runs).values()] == [[0, 1], [0]]  # never pooled


def test_commit_from_config_else_journal_else_not_recorded(tmp_path):
    fabricate(tmp_path, "capsnet_r1", 0, 1.0, commit=None)
    [run] = load(tmp_path, ["capsnet_r1"], [0])
    assert (run.commit, run.commit_source) == ("not recorded", "not recorded")
    (tmp_path / "journal").mkdir()
    (tmp_path / "journal" / "capsnet_r1-0.jsonl").write_text(
        json.dumps({"event": "start", "tags": {"git_commit": "17bb48c"}}) + "\n")
    [run] = load(tmp_path, ["capsnet_r1"], [0])  # the journal beside models/ names it
    assert (run.commit, run.commit_source) == ("17bb48c", "tracking journal")
    assert rr.run_provenance([run]).iloc[0].commit == "17bb48c (journal tag)"
    assert rr.recorded_commit({"environment": {"git_commit": "deadbee"}, "run_id": "capsnet_r1-0"},
                              tmp_path / "journal") == ("deadbee", "config.json")


def test_run_provenance_shows_what_each_run_recorded_and_nothing_else(tmp_path):
    fabricate(tmp_path, "capsnet_r1", 0, 1.0, adam_eps=None, resumed=None, amp=True, device="cuda")
    fabricate(tmp_path, "capsnet_r1", 1, 1.0, resumed=[20, 35], history=[1.0] * 50)
    runs = load(tmp_path, ["capsnet_r1"], [0, 1])
    table = rr.run_provenance(runs).set_index("seed")
    assert table.loc[0, "adam_eps"] == "not recorded" and table.loc[1, "adam_eps"] == 1e-8
    assert table.loc[0, "resumed_at_epoch"] == "not recorded" and table.loc[1, "resumed_at_epoch"] == "20, 35"
    assert table.loc[0, "precision"] == "bf16 autocast" and table.loc[1, "precision"] == "fp32"  # amp only on CUDA
    assert table.loc[1, "epochs_trained"] == 50 == len(runs[1].history)  # the epochs its history holds
    for seed, (tf32, precision) in enumerate([(False, "fp32"), (True, "TF32"),
                                              (None, "fp32, TF32 convolutions (not recorded: torch's default)")], 2):
        fabricate(tmp_path, "capsnet_r1", seed, 1.0, device="cuda", tf32=tf32)  # fp32 on CUDA: as train.tf32 said
        assert load(tmp_path, ["capsnet_r1"], [seed])[0].precision == precision
    runs[0].config["resumed_from_epoch"] = 40  # what the published runs record: the last resume only
    assert runs[0].resume_epochs == [40] and runs[0].resumed == ("40 (the last resume; earlier ones not recorded) "
                                                                 "(its checkpoint was already final: the last start trained nothing)")
    runs[0].config["resumed_from_epoch"] = 0
    assert runs[0].resume_epochs == [] and runs[0].resumed == "no"
    text = markdown(t1.summarize(runs, REFERENCE), t1.effects(runs, REFERENCE), profile="gpu",
                              deviations=["d"], provenance={}, figures={}, reference=REFERENCE,
                              run_table=rr.run_provenance(runs))
    assert "### Each run as it recorded itself" in text and "| capsnet_r1 | 1 | c0ffee0123456789abcdef0123456789abcdef01 | not recorded | 1e-08 |" in text


def test_what_a_run_did_not_record_reads_not_recorded_never_a_default(tmp_path):
    """A run read from its own files: a field its record lacks (profile, stop reason, torch version,
    amp, compile, deterministic; a history without a learning-rate column) is "not recorded", never
    today's default. Its schedule lists an lr setting the formula does not name after the formula; its
    best epoch is the epoch its history names, not the row's position; an error rate with no image
    count beside it (none, or 0) is read as stored, not as a count over n."""
    fabricate(tmp_path, "capsnet_r1", 0, 1.0, history=[3.0, 1.0, 2.0])

    def unrecorded(record):
        for key in ("profile", "amp", "compile", "deterministic"):
            del record["config"][key]
        del record["stop_reason"], record["environment"]["torch_version"]
        record["config"]["lr_warmup_steps"] = 500
    edit_record(tmp_path, "capsnet_r1", 0, unrecorded)
    model_dir = tmp_path / "models" / "capsnet_r1" / "seed0"
    history = pd.read_csv(model_dir / "history.csv").drop(columns="lr")
    history["epoch"] += 10  # a history that goes on from epoch 11
    history.to_csv(model_dir / "history.csv", index=False)
    [run] = load(tmp_path, ["capsnet_r1"], [0])
    assert run.schedule == ("not recorded profile: 3 epochs × batch 128, lr 0.001·0.96^(step/2000) ≥ 1e-06, "
                            "lr_warmup_steps 500")
    assert math.isnan(run.final_lr) and rr.best_epoch(run.history) == (1.0, 12)
    row = rr.run_provenance([run]).iloc[0]
    assert row[["stop_reason", "torch", "amp", "compile", "deterministic"]].tolist() == ["not recorded"] * 5
    for n in (None, 0):
        assert rr.uniform_metrics({"error_pct": 0.38999998942017555, "n_test": n}, "test", "x")["error_pct"] == (
            0.38999998942017555)


def test_runs_that_do_not_record_adam_eps_or_resumed_are_named(tmp_path):
    for variant in ("capsnet_r1", "capsnet_r3"):
        fabricate(tmp_path, variant, 0, 1.0, adam_eps=None, commit=None)
    fabricate(tmp_path, "capsnet_r1_recon", 0, 1.0, resumed=[20])
    runs = load(tmp_path, ["capsnet_r1", "capsnet_r3", "capsnet_r1_recon"], [0])
    eps, cut, resumed = rp.run_deviations(runs, ADAM_EPS)
    assert "**cut** at 1 epochs" in cut  # the fabricated runs train 1 epoch of the uncompressed schedule
    assert runs[0].schedule.startswith("gpu profile: 1 epoch × batch")  # one epoch, not "1 epochs"
    assert eps.startswith("Adam ε is not recorded by 2 of 3 runs (capsnet_r1, capsnet_r3; trained at not recorded")
    assert "1e-07" not in eps  # nothing filled from an old default
    assert "1 of 3 runs resumed" in resumed and "capsnet_r1_recon 0@20" in resumed
    for run in runs[:2]:
        run.config["optimizer"] = {"name": "adam", "adam_eps": 1e-8}
    runs[2].config["resumed_at_epochs"] = []
    assert rp.run_deviations(runs, ADAM_EPS) == [cut]
    runs[0].config["optimizer"]["adam_eps"] = 1e-7  # recorded, but not today's
    assert rp.run_deviations(runs, ADAM_EPS) == [f"Adam ε = 1e-07 in 1 of 3 runs (capsnet_r1), not today's {ADAM_EPS:g}.", cut]


def test_the_papers_length_and_an_early_stop_are_not_cut_a_runs_every_resume_is_named_and_epoch_spans_stay_whole(tmp_path):
    fabricate(tmp_path, "capsnet_r1", 0, 1.0, epochs=640)
    fabricate(tmp_path, "capsnet_r1", 1, 1.0, epochs=50, resumed=[20, 40])
    fabricate(tmp_path, "capsnet_r3", 0, 1.0, epochs=300)
    fabricate(tmp_path, "capsnet_affnist", 0, 1.0, image_size=40, stop_reason="target", epochs=30)  # §5.2's early stop
    runs = load(tmp_path, ["capsnet_r1", "capsnet_r3", "capsnet_affnist"], [0, 1],
                skip=[("capsnet_r3", 1), ("capsnet_affnist", 1)])
    cut, resumed = rp.run_deviations(runs, ADAM_EPS)
    assert cut.startswith("2 of 4 runs trained the paper's schedule **cut** at 50–300 epochs")
    assert "capsnet_r1 1@20/40" in resumed


def test_a_schedule_as_long_as_its_training_is_cut_not_compressed_and_each_span_shows_its_range(tmp_path):
    """train.lr_schedule_epochs equal to the epochs trained decays the schedule uncompressed: short of
    640 epochs it is a cut, as with 0. Each deviation spans its runs' epochs and last learning rates."""
    for seed in (0, 1):
        fabricate(tmp_path, "capsnet_r1", seed, 1.0, history=[2.0, 1.0], lr_schedule_epochs=640)
    fabricate(tmp_path, "capsnet_r3", 0, 1.0, history=[2.0, 1.0, 0.5], lr_schedule_epochs=3)
    fabricate(tmp_path, "capsnet_r3", 1, 1.0, history=[2.0, 1.0])
    history = tmp_path / "models" / "capsnet_r1" / "seed1" / "history.csv"
    pd.read_csv(history).assign(lr=[1e-3, 5e-6]).to_csv(history, index=False)
    runs = load(tmp_path, ["capsnet_r1", "capsnet_r3"], [0, 1])
    compressed, cut = rp.run_deviations(runs, ADAM_EPS)
    assert compressed.startswith("2 of 4 runs decay the learning rate of 640 epochs compressed into their 2 ")
    assert "last epoch ends at lr 5e-06–0.0009;" in compressed
    assert cut.startswith("2 of 4 runs trained the paper's schedule **cut** at 2–3 epochs, not compressed: "
                          "their last epoch's learning rate is 0.00081–0.0009 ")
    assert "0.96^(step/2000) ≥" in runs[2].schedule  # no "· 3/3": its protocol is the uncompressed one
    cfg = {"profile": "gpu", "epochs": 3, "batch_size": 128, "lr": 1e-3}
    assert protocol.protocol_key(cfg | {"lr_schedule_epochs": 3}, "cpu") == protocol.protocol_key(cfg, "cpu")
    assert protocol.protocol_key(cfg | {"lr_schedule_epochs": 640}, "cpu") != protocol.protocol_key(cfg, "cpu")


def test_the_provenance_lines_count_each_commit_fingerprint_variant_resume_and_minute(tmp_path):
    """The report's provenance: runs per commit (where it was read) and per fingerprint, every protocol,
    each device with its CUDA build, each torch and Python, each variant's seeds, the seeds not run,
    the resumed runs, the minutes trained (6 epochs of 1 s), and the records a later run superseded."""
    from conftest import REPO
    from pipeline.core.params import load_params
    from pipeline.stages import report as report_stage

    fabricate(tmp_path, "capsnet_r1", 0, 1.0, history=[3.0, 2.0, 1.0], fingerprint="fpA")
    fabricate(tmp_path, "capsnet_r1", 1, 1.0, history=[2.0, 1.0], fingerprint="fpA", resumed=[1])
    fabricate(tmp_path, "capsnet_r3", 0, 1.0, commit=None, fingerprint="fpB")
    runs = load(tmp_path, ["capsnet_r1"], [0, 1]) + load(tmp_path, ["capsnet_r3"], [0])
    p = load_params(REPO / "params.yaml")
    said = report_stage.provenance(p, runs, {"capsnet_r3": [1, 2]}, superseded=[runs[1]])
    assert said["training commits"] == f"{COMMIT} (from config.json): 2 runs; not recorded: 1 runs"
    assert said["training fingerprints"].startswith("fpA: 2 runs; fpB: 1 runs (")
    schedule = "× batch 128, lr 0.001·0.96^(step/2000) ≥ 1e-06, fp32"
    assert said["protocols"] == "; ".join(f"gpu profile: {n} {schedule}" for n in ("3 epochs", "2 epochs", "1 epoch"))
    assert said["devices"] == "cpu, torch CUDA build not recorded" and said["training software"] == "torch t, Python p"
    assert said["runs"] == "capsnet_r1: seeds 0, 1; capsnet_r3: seeds 0" and said["not run"] == "capsnet_r3: seeds 1, 2"
    assert said["resumed from a checkpoint"].startswith("1 of 3 runs") and said["seeds"] == "0, 1, 2"
    assert said["total training time"].startswith("0.1 min over 3 runs")
    assert said["trained again, the earlier record not counted"] == \
        "capsnet_r1 seed 1 (run capsnet_r1-1, in reports/runs/earlier)"
    assert said["report software"].startswith("torch ") and "mlflow " in said["report software"]
    nothing_else = report_stage.provenance(p, runs, {}, superseded=[])
    assert nothing_else["not run"] == "none" and "trained again, the earlier record not counted" not in nothing_else


@pytest.mark.parametrize("image_size, clean, transformed", [(28, "test", "affine_test"),
                                                            (40, "expanded_test", "affnist_test")])
def test_runs_evaluated_before_uniform_metric_keys_still_load(tmp_path, image_size, clean, transformed):
    """The published GPU runs' metrics.json name the sets in the keys (test_error_pct, n_affine_test)."""
    fabricate(tmp_path, "capsnet_r1", 0, 1.0, image_size=image_size)
    path = tmp_path / "results" / "capsnet_r1" / "seed0" / "metrics.json"
    path.write_text(json.dumps({f"{clean}_error_pct": 1.0, f"{transformed}_error_pct": 50.0, f"n_{clean}": 200,
                                f"n_{transformed}": 200, "n_params": 5, "epochs_trained": 1, "reached_target": False}))
    [run] = load(tmp_path, ["capsnet_r1"], [0])
    assert run.metrics == {"error_pct": 1.0, "transformed_error_pct": 50.0, "n_test": 200, "n_transformed": 200,
                           "n_params": 5, "epochs_trained": 1, "reached_target": False}


@pytest.mark.parametrize("missing", ["metrics.json", "predictions.safetensors", "breakdown.json", "config.json",
                                     "history.csv"])
def test_a_run_missing_any_of_its_five_files_is_listed_as_missing_and_named_when_loaded(tmp_path, missing):
    fabricate(tmp_path, "capsnet_r1", 0, 1.0)
    folder = "models" if missing in ("config.json", "history.csv") else "results"
    (tmp_path / folder / "capsnet_r1" / "seed0" / missing).unlink()
    assert rr.missing_runs(tmp_path / "models", tmp_path / "results", ["capsnet_r1"], [0]) == [("capsnet_r1", 0)]
    with pytest.raises(rr.ReportError, match=f"variant capsnet_r1 seed 0 has no evaluation: missing .*/{missing}"):
        load(tmp_path, ["capsnet_r1"], [0])


def test_a_run_reads_its_device_and_epochs_as_recorded_and_a_pair_right_only_as_a_whole(tmp_path):
    """The device the run resolved (params.device, not the config's `auto`) with its name; the epochs and
    images (steps × batch) it recorded, its history's length where it recorded no epochs (a record's history may be the shorter);
    a MultiMNIST prediction (two sorted digits) is right only when both digits are."""
    fabricate(tmp_path, "capsnet_r1", 0, 1.0, device="auto", history=[3.0, 2.0, 1.0])
    edit_record(tmp_path, "capsnet_r1", 0, lambda record: record.update(
        params={"device": "cuda:0"}, environment={**record["environment"], "device_name": "NVIDIA H200"},
        epochs_trained=640, steps_trained=300))
    pairs = torch.tensor([[1, 2], [3, 4], [5, 6]], dtype=torch.uint8)
    save_file({"test_labels": pairs, "test_preds": torch.tensor([[1, 2], [3, 5], [0, 6]], dtype=torch.uint8)},
              str(tmp_path / "results" / "capsnet_r1" / "seed0" / "predictions.safetensors"))
    [run] = load(tmp_path, ["capsnet_r1"], [0])
    assert run.device == "cuda:0 (NVIDIA H200)" and run.epochs_trained == 640
    assert run.images_trained == 300 * run.cfg["batch_size"]  # steps × batch: what the claims' GPU-hours scale by
    assert run.correct["test"].tolist() == [True, False, False]
    edit_record(tmp_path, "capsnet_r1", 0, lambda record: record.pop("epochs_trained"))
    assert load(tmp_path, ["capsnet_r1"], [0])[0].epochs_trained == 3


def test_publishing_takes_whole_runs_and_sets_aside_a_record_without_run_id_or_set_aside_before(tmp_path):
    """publish_runs: a run missing one of its records is not published; a published record older than run
    ids goes to earlier/unrecorded/, where the report reads it; a record set aside a second time replaces
    its first copy there (republishing the older run, then the newer, again)."""
    partial, old, new, pub = (tmp_path / name for name in ("partial", "old", "new", "pub"))
    fabricate(partial, "capsnet_r3", 0, 1.0)
    (partial / "models" / "capsnet_r3" / "seed0" / "history.csv").unlink()
    assert publish.publish_runs(partial / "models", partial / "results", pub) == []
    assert not (pub / "models" / "capsnet_r3" / "seed0").exists()
    fabricate(old, "capsnet_r3", 0, 1.0, commit="17bb48c")
    edit_record(old, "capsnet_r3", 0, lambda record: record.pop("run_id"))
    fabricate(new, "capsnet_r3", 0, 0.5, commit="b8f3efe")
    for run in (old, new, old, new):
        assert publish.publish_runs(run / "models", run / "results", pub) == [("capsnet_r3", 0)]
    aside = pub / "earlier" / "unrecorded" / "models" / "capsnet_r3" / "seed0"
    assert (aside / "config.json").is_file() and not (aside / "seed0").exists()
    current = rr.load_runs(pub / "models", pub / "results", ["capsnet_r3"], [0])
    runs = publish.with_earlier(current, pub / "models", ["capsnet_r3"], [0])
    assert [r.metrics["error_pct"] for r in runs if r.commit == "17bb48c"] == [1.0]  # read back from there, once
    assert runs[-1].commit == "b8f3efe"  # the current record
