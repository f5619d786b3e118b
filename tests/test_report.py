"""The report's arithmetic and wording on fabricated per-seed evaluation files."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import save_file
from scipy import stats as sp

from conftest import with_ablation
from pipeline.core import lineage, protocol
from pipeline.experiments import affnist_report as ra
from pipeline.experiments import table1_figures as t1_figures
from pipeline.experiments import table1_report as t1
from pipeline.report import claims as rc
from pipeline.report import document as rp
from pipeline.report import publish
from pipeline.report import runs as rr
from pipeline.report.rows import bridge, group, protocols, same_code
from pipeline.training.config import ADAM_EPS

REFERENCE = rr.paper_reference()


def markdown(summary, effect_table, *, reference, claims=None, **document) -> str:
    """ablation.md holding Table 1's section alone (as the report stage renders it), for the wording."""
    section = rp.Section(lines=t1.render_section(summary, effect_table, reference), claims=claims,
                         protocol=summary.protocol.iloc[0])
    return rp.render([section], **document)
COMMIT = "c0ffee0123456789abcdef0123456789abcdef01"


def fabricate(root, variant, seed, error_pct, n=200, affine_pct=50.0, model="capsnet", recon=True, image_size=28,
              stop_reason="budget", bins=None, recipe=None, history=None, epochs=None, commit=COMMIT,
              adam_eps=1e-8, resumed=None, amp=False, device="cpu", lr_schedule_epochs=None, fingerprint=None,
              fingerprint_env=None, tf32=None):
    """Evaluation files whose per-image predictions give exactly error_pct (clean set) and affine_pct
    (transformed set) on n images; 40×40 variants get §5.2's set names. ``commit``/``adam_eps``/
    ``resumed`` None: the run does not record them (as the 17bb48c runs)."""
    model_dir, result_dir = root / "models" / variant / f"seed{seed}", root / "results" / variant / f"seed{seed}"
    model_dir.mkdir(parents=True)
    result_dir.mkdir(parents=True)
    clean, transformed = ("test", "affine_test") if image_size == 28 else ("expanded_test", "affnist_test")
    labels = torch.zeros(n, dtype=torch.uint8)
    preds = labels.clone()
    preds[: round(n * error_pct / 100)] = 1
    affine_preds = labels.clone()
    affine_preds[: round(n * affine_pct / 100)] = 1
    save_file({f"{clean}_labels": labels, f"{clean}_preds": preds, f"{transformed}_labels": labels.clone(),
               f"{transformed}_preds": affine_preds}, str(result_dir / "predictions.safetensors"))
    (result_dir / "metrics.json").write_text(json.dumps(
        {"error_pct": error_pct, "transformed_error_pct": affine_pct, "n_test": n, "n_transformed": n,
         "n_params": 8215568, "epochs_trained": 1, "reached_target": stop_reason == "target"}))
    (result_dir / "breakdown.json").write_text(json.dumps(
        {"per_class": {}, "sources": {transformed: f"{transformed} (fabricated)"}, "bins": bins or {}}))
    history = history or [error_pct]
    config = {"model": model, "routing_iterations": 1 if "_r1" in variant else 3, "reconstruction": recon, "image_size": image_size,
              "target_accuracy_pct": 99.23 if image_size == 40 else 0.0, "profile": "gpu",
              "epochs": epochs or len(history), "batch_size": 128, "lr": 0.001, "lr_decay_rate": 0.96,
              "lr_decay_steps": 2000, "lr_min": 1e-6, "amp": amp, "compile": True, "deterministic": False,
              "device": device}
    if recipe is not None:  # runs from before recipes existed have none
        config["recipe"] = recipe
    if lr_schedule_epochs is not None:  # runs from before compressed schedules have none
        config["lr_schedule_epochs"] = lr_schedule_epochs
    if tf32 is not None:  # runs from before train.tf32 have none
        config["tf32"] = tf32
    record = {"config": config, "params": {"device": device}, "train_seconds": 1.0, "stop_reason": stop_reason,
              "epochs_trained": len(history), "run_id": f"{variant}-{seed}",
              "environment": {"torch_version": "t", "python_version": "p"} | ({"git_commit": commit} if commit else {})
              | ({"fingerprint_environment": fingerprint_env} if fingerprint_env else {})}
    if adam_eps is not None:
        record["optimizer"] = {"name": "adam", "adam_eps": adam_eps}
    if resumed is not None:
        record["resumed_at_epochs"] = resumed
    if fingerprint is not None:  # runs from before the training fingerprint have none
        record["training_fingerprint"] = fingerprint
    (model_dir / "config.json").write_text(json.dumps(record))
    pd.DataFrame({"epoch": range(1, len(history) + 1), "test_error_pct": history,
                  "lr": [1e-3 * 0.9 ** k for k in range(len(history))],
                  "epoch_seconds": [1.0] * len(history)}).to_csv(model_dir / "history.csv", index=False)


def edit_record(root, variant, seed, edit):
    """Rewrite a fabricated run's config.json as ``edit`` changes the record in place, for what
    `fabricate`'s parameters do not reach (a field removed, a record as an older run wrote it)."""
    path = root / "models" / variant / f"seed{seed}" / "config.json"
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))


def fabricate_cnn_affnist(root, seed, **kw):
    """`fabricate` §5.2's CNN (pooling_cnn on the 40×40 canvas, no decoder) at 1 % expanded-MNIST error."""
    fabricate(root, "cnn_affnist", seed, 1.0, model="pooling_cnn", recon=False, image_size=40, **kw)


def load(root, variants, seeds, **kw):
    return rr.load_runs(root / "models", root / "results", variants, seeds, **kw)


def test_means_stds_deltas_and_a_seed_aware_verdict(tmp_path):
    for seed, err in enumerate([0.5, 1.0, 1.5]):
        fabricate(tmp_path, "capsnet_r3_recon", seed, err)
    row = t1.summarize(load(tmp_path, ["capsnet_r3_recon"], [0, 1, 2]), REFERENCE).iloc[0]
    assert row.n_seeds == 3 and row.seeds == "0 1 2" and row.commit == COMMIT
    assert row.test_error_mean == pytest.approx(1.0)
    assert row.test_error_std == pytest.approx(0.5)  # sample std of 0.5, 1.0, 1.5
    assert row.delta == pytest.approx(1.0 - 0.25)
    assert row.paper_test_error == 0.25 and row.paper_test_error_std == 0.005
    assert row.test_errors == "0.50 1.00 1.50"
    # ours − paper: SE² = 0.5²/3 + 0.005²/3, ν ≈ 2, t ≈ 4.30: [−0.49, +1.99] covers 0
    assert row.delta_ci_low == pytest.approx(-0.49, abs=0.01) and row.delta_ci_high == pytest.approx(1.99, abs=0.01)
    assert row.verdict == "consistent"


def test_a_tight_row_far_from_the_paper_is_not_reproduced_and_one_seed_gets_no_verdict(tmp_path):
    for seed, err in enumerate([1.0, 1.5, 1.0]):
        fabricate(tmp_path, "capsnet_r1", seed, err)
    fabricate(tmp_path, "capsnet_r3", 0, 1.0)
    summary = t1.summarize(load(tmp_path, ["capsnet_r1"], [0, 1, 2]) + load(tmp_path, ["capsnet_r3"], [0]),
                           REFERENCE).set_index("variant")
    assert summary.loc["capsnet_r1", "test_error_mean"] == pytest.approx(3.5 / 3)  # the mean, not the median 1.0
    assert summary.loc["capsnet_r1", "verdict"] == "not reproduced" and summary.loc["capsnet_r1", "delta_ci_low"] > 0
    assert summary.loc["capsnet_r3", "verdict"] == "one seed: no verdict"
    assert math.isnan(summary.loc["capsnet_r3", "delta_ci_low"])


def test_the_verdict_counts_the_papers_own_spread(tmp_path):
    """capsnet_r1 at 0.40, 0.41, 0.42 % against the paper's 0.34 ± 0.032 %: our seeds alone would put
    0.34 outside the interval (+0.07 ± 4.30 · 0.0058 = [+0.045, +0.095]); the paper's σ over its 3
    trials belongs in it, SE² = 0.01²/3 + 0.032²/3 with ν ≈ 2.4, and then it covers 0."""
    for seed, err in enumerate([0.40, 0.41, 0.42]):
        fabricate(tmp_path, "capsnet_r1", seed, err)
    row = t1.summarize(load(tmp_path, ["capsnet_r1"], [0, 1, 2]), REFERENCE).iloc[0]
    ours, paper = 0.01 ** 2 / 3, 0.032 ** 2 / 3
    df = (ours + paper) ** 2 / (ours ** 2 / 2 + paper ** 2 / 2)
    half = float(sp.t.ppf(0.975, df)) * math.sqrt(ours + paper)
    assert (row.delta_ci_low, row.delta_ci_high) == pytest.approx((0.07 - half, 0.07 + half))
    assert row.delta_ci_low < 0 and row.verdict == "consistent"


def test_effects_are_seed_aware_and_say_what_the_interval_supports(tmp_path):
    for seed, (a, b) in enumerate([(5.0, 20.0), (5.5, 20.5), (4.5, 19.5)]):
        fabricate(tmp_path, "capsnet_r3_recon", seed, a)
        fabricate(tmp_path, "capsnet_r1_recon", seed, b)
    runs = load(tmp_path, ["capsnet_r3_recon", "capsnet_r1_recon"], [0, 1, 2])
    row = t1.effects(runs, REFERENCE).iloc[0]
    assert row.effect.startswith("routing 3 vs 1, with") and row.commit == COMMIT[:7]
    assert row.our_delta == pytest.approx(-15.0) and row.paper_delta == pytest.approx(-0.04)
    assert row.ci_high < 0 and row.status == "A lower, beyond seed and test noise"
    assert row.per_seed == "-15.00 -15.00 -15.00"
    noisy = tmp_path / "noisy"  # a noisy B: seed spread 4 pp
    for seed, (a, b) in enumerate([(1.0, 1.0), (2.0, 9.0), (1.5, 5.0)]):
        fabricate(noisy, "capsnet_r3_recon", seed, a)
        fabricate(noisy, "capsnet_r1_recon", seed, b)
    row = t1.effects(load(noisy, ["capsnet_r3_recon", "capsnet_r1_recon"], [0, 1, 2]), REFERENCE).iloc[0]
    assert row.our_delta == pytest.approx(-3.5) and row.ci_low < 0 < row.ci_high
    assert row.status == "not distinguishable from noise"  # an image-only interval would call −3.5 pp real


def test_the_precision_check_compares_bf16_with_its_fp32_twin_across_the_precisions(tmp_path):
    """#36 item 6: capsnet_r3_recon (bf16 autocast) against capsnet_r3_recon_fp32 (the same protocol in
    fp32, TF32 off) is an effect of the bf16 protocol's table, though the two rows are two protocols;
    TF32 or another schedule is not its twin; the decision for the paper protocol follows the interval;
    the twin's own Table 1 row is compared with capsnet_r3_recon's paper value."""
    def arms(root, bf16, fp32, **twin):
        for seed, (a, b) in enumerate(zip(bf16, fp32)):
            fabricate(root, "capsnet_r3_recon", seed, a, amp=True, device="cuda", tf32=False)
            fabricate(root, "capsnet_r3_recon_fp32", seed, b, amp=False, device="cuda", **({"tf32": False} | twin))
        return load(root, ["capsnet_r3_recon", "capsnet_r3_recon_fp32"], [0, 1, 2])

    runs = arms(tmp_path / "same", [1.0, 1.5, 2.0], [1.5, 1.0, 2.0])
    summary, table = t1.summarize(runs, REFERENCE), t1.effects(runs, REFERENCE)
    assert list(summary.protocol.str.rsplit(", ", n=1).str[1]) == ["bf16 autocast", "fp32"]
    assert summary.set_index("variant").loc["capsnet_r3_recon_fp32", "paper_test_error"] == 0.25
    assert len(table) == 1
    row = table.iloc[0]
    assert (row.a, row.b, row.protocol) == ("capsnet_r3_recon", "capsnet_r3_recon_fp32", summary.protocol.iloc[0])
    assert row.our_delta == pytest.approx(0.0) and row.ci_low < 0 < row.ci_high and math.isnan(row.paper_delta)
    assert row.per_seed == "-0.50 +0.50 +0.00" and not math.isnan(row.equivalence_margin)
    assert t1.precision_decision(row).endswith("within the seed noise, so the paper protocol may train in bf16 autocast")
    two = row.copy()
    two["n_seeds"] = 2  # too few to decide, whatever the interval
    assert t1.precision_decision(two) == "undecided (2 seed(s) a side of the 3 it needs): the paper protocol trains in fp32"
    text = markdown(summary, table, profile="gpu", deviations=["d"], provenance={}, figures={}, reference=REFERENCE)
    assert "**Precision check** (bf16 autocast against the same protocol in fp32" in text
    assert "Precision check: bf16 − fp32 = +0.00 pp" in "\n".join(t1.readme_lines(summary, table))
    apart = t1.effects(arms(tmp_path / "apart", [5.0, 5.5, 4.5], [1.0, 1.5, 0.5]), REFERENCE).iloc[0]
    assert apart.ci_low > 0 and t1.precision_decision(apart).endswith("beyond the seed noise, so the paper protocol "
                                                                       "trains in fp32")
    assert t1.effects(arms(tmp_path / "tf32", [1.0, 1.5, 2.0], [1.5, 1.0, 2.0], tf32=True), REFERENCE).empty
    assert t1.effects(arms(tmp_path / "long", [1.0, 1.5, 2.0], [1.5, 1.0, 2.0], epochs=640), REFERENCE).empty


def test_the_precision_check_needs_a_bf16_arm_and_a_confounded_effect_names_every_commit_of_each_arm(tmp_path):
    """Both arms in fp32 (a CPU profile) make no precision effect; a decision quotes the equivalence bound
    where there is one; a confounded effect names each commit its arm's rows trained at."""
    for seed in (0, 1, 2):
        fabricate(tmp_path / "fp32", "capsnet_r3_recon", seed, 1.0 + seed / 2, tf32=False)
        fabricate(tmp_path / "fp32", "capsnet_r3_recon_fp32", seed, 1.0 + seed / 2, tf32=False)
    both_fp32 = load(tmp_path / "fp32", ["capsnet_r3_recon", "capsnet_r3_recon_fp32"], [0, 1, 2])
    assert t1.effects(both_fp32, REFERENCE).empty
    row = pd.Series({"ci_low": -0.1, "ci_high": 0.1, "n_seeds": 3, "our_delta": 0.0, "equivalence_margin": 0.08,
                     "status": "not distinguishable from noise"})
    assert t1.precision_decision(row) == ("bf16 − fp32 = +0.00 pp [-0.10, +0.10] over 3 seeds a side (two one-sided "
                                          "tests at 5 % bound it within ±0.08 pp): within the seed noise, so the "
                                          "paper protocol may train in bf16 autocast")
    fabricate(tmp_path / "apart", "capsnet_r3_recon", 0, 1.0, commit="aaaaaaa1111")
    fabricate(tmp_path / "apart", "capsnet_r3_recon", 1, 3.0, commit="ccccccc3333")
    fabricate(tmp_path / "apart", "capsnet_r1_recon", 0, 1.0, commit="bbbbbbb2222")
    runs = load(tmp_path / "apart", ["capsnet_r3_recon"], [0, 1]) + load(tmp_path / "apart", ["capsnet_r1_recon"], [0])
    effect = t1.effects(runs, REFERENCE).set_index("effect").loc["routing 3 vs 1, with reconstruction"]
    assert effect.status.startswith("confounded: capsnet_r3_recon trained at aaaaaaa; ccccccc (Adam ε 1e-08), "
                                    "capsnet_r1_recon at bbbbbbb")


def test_rows_never_pool_protocols_or_commits(tmp_path):
    """A row is (variant, protocol, commit): a variant's seeds at two commits are two rows; each protocol
    gets its own Table 1 (the one with most runs first); an effect across commits is confounded, without interval."""
    for seed in (0, 1):
        fabricate(tmp_path, "capsnet_r1", seed, 1.0 + seed, commit="aaaaaaa1111", history=[2.0, 1.0 + seed])
        fabricate(tmp_path, "capsnet_r3", seed, 2.0, commit="bbbbbbb2222", adam_eps=None, history=[2.0, 2.0])
        fabricate(tmp_path, "capsnet_r1_recon", seed, 1.0, epochs=640, history=[2.0, 1.0])
    fabricate(tmp_path, "capsnet_r3_recon", 0, 1.0, commit="aaaaaaa1111", history=[2.0, 1.0])
    fabricate(tmp_path, "capsnet_r3_recon", 1, 3.0, commit="ccccccc3333", history=[2.0, 3.0])
    variants = ["capsnet_r1", "capsnet_r3", "capsnet_r1_recon", "capsnet_r3_recon"]
    runs = load(tmp_path, variants, [0, 1])
    summary = t1.summarize(runs, REFERENCE)
    assert len(summary) == 5  # capsnet_r3_recon's two seeds at two commits: two rows of n = 1
    recon = summary[summary.variant == "capsnet_r3_recon"]
    assert list(recon.n_seeds) == [1, 1] and list(recon.test_error_mean) == [1.0, 3.0]
    assert list(summary.protocol.str.split(":").str[1].str.split("×").str[0]) == [" 2 epochs "] * 4 + [" 640 epochs "]
    table = t1.effects(runs, REFERENCE).set_index("effect")
    routing = table.loc["routing 3 vs 1, no reconstruction"]
    assert routing.status == ("confounded: capsnet_r3 trained at bbbbbbb (Adam ε not recorded), capsnet_r1 at aaaaaaa "
                              "(Adam ε 1e-08), no commit in common")
    assert math.isnan(routing.ci_low) and routing.our_delta == pytest.approx(0.5)
    assert "routing 3 vs 1, with reconstruction" not in table.index  # r1_recon trained under another protocol
    text = markdown(summary, t1.effects(runs, REFERENCE), profile="gpu", deviations=["d"], provenance={},
                              figures={}, reference=REFERENCE)
    long, short = text.index("## Table 1 — gpu profile: 640 epochs"), text.index("## Table 1 — gpu profile: 2 epochs")
    assert short < long  # six runs before two
    assert "| capsnet_r1_recon | paper | 1 | yes | c0ffee0 | 2 |" in text[long:]
    assert "| capsnet_r3_recon | paper | 3 | yes | aaaaaaa | 1 | 1.00 ± – |" in text[short:long]
    assert "| capsnet_r3_recon | paper | 3 | yes | ccccccc | 1 | 3.00 ± – |" in text[short:long]


def test_the_headline_protocol_is_the_one_with_most_runs_then_the_longest_then_the_newest(tmp_path):
    """The claims and the README read the first protocol: a protocol a GPU window has only begun (one
    seed) does not displace one whose seeds are all there, though its record loads first; of as many
    runs, the paper's length comes before a shorter protocol, and of the same length the newest."""
    def keys(root, spec):  # spec: (variant, seed, epochs, lr_schedule_epochs) in load order
        for variant, seed, epochs, pace in spec:
            fabricate(root, variant, seed, 1.0, epochs=epochs, lr_schedule_epochs=pace)
        runs = [r for v, s, _, _ in spec for r in load(root, [v], [s])]
        return [(k[1], "compressed" if dict(k[3]).get("lr_schedule_epochs") else "cut") for k in protocols(runs)]

    begun = [("capsnet_r1", 0, 50, 640), ("capsnet_r1", 1, 50, None), ("capsnet_r1", 2, 50, None), ("capsnet_r3", 0, 50, None)]
    assert keys(tmp_path / "begun", begun) == [(50, "cut"), (50, "compressed")]
    both = [("capsnet_r1", 0, 50, 640), ("capsnet_r1", 1, 640, None)]
    assert keys(tmp_path / "both", both) == [(640, "cut"), (50, "compressed")]
    done = [("capsnet_r1", 0, 50, 640), ("capsnet_r3", 0, 50, None)]
    assert keys(tmp_path / "done", done) == [(50, "compressed"), (50, "cut")]
    # every seed retrained: each older record set aside, loaded before the run that displaced it
    fabricate(tmp_path / "old", "capsnet_r1", 0, 1.0, epochs=50)
    fabricate(tmp_path / "new", "capsnet_r1", 0, 1.0, epochs=50, lr_schedule_epochs=640)
    runs = load(tmp_path / "old", ["capsnet_r1"], [0]) + load(tmp_path / "new", ["capsnet_r1"], [0])
    assert [dict(k[3]).get("lr_schedule_epochs") for k in protocols(runs)] == [640, None]


def test_runs_with_one_training_fingerprint_pool_across_commits(tmp_path):
    """A run that records its training fingerprint is compared by it, not by its commit: the same
    fingerprint at two commits is one row (its cell naming both commits); another fingerprint at the
    same commit is another row. Two variants' fingerprints always differ (the model is part of what
    is fingerprinted): their rows compare through a commit whose code trained runs of both (an
    effect with an interval, one README line), and are confounded where they share none."""
    for seed, commit in ((0, "aaaaaaa1111"), (1, "bbbbbbb2222"), (2, "bbbbbbb2222")):
        fabricate(tmp_path, "capsnet_r1", seed, 1.0 + seed / 10, n=1000, commit=commit, fingerprint="1234abcd5678ef90")
        fabricate(tmp_path, "capsnet_r3", seed, 0.9 + seed / 10, n=1000, commit="aaaaaaa1111",
                  fingerprint="3333cccc3333cccc")
        fabricate(tmp_path, "capsnet_r3_recon", seed, 0.8 + seed / 10, n=1000, commit="ccccccc3333",
                  fingerprint="5555eeee5555eeee")
    fabricate(tmp_path, "capsnet_r1_recon", 0, 1.0, n=1000, commit="aaaaaaa1111", fingerprint="feedfacefeedface")
    fabricate(tmp_path, "capsnet_r1_recon", 1, 1.2, n=1000, commit="aaaaaaa1111", fingerprint="0000aaaa0000aaaa")
    runs = (load(tmp_path, ["capsnet_r1", "capsnet_r3", "capsnet_r3_recon"], [0, 1, 2])
            + load(tmp_path, ["capsnet_r1_recon"], [0, 1]))
    summary = t1.summarize(runs, REFERENCE).set_index("variant")
    assert summary.loc["capsnet_r1"].n_seeds == 3 and summary.loc["capsnet_r1"].commit == "fp 1234abcd: aaaaaaa, bbbbbbb"
    assert list(summary.loc["capsnet_r1_recon"].n_seeds) == [1, 1]  # two fingerprints, one commit: two rows
    effects = t1.effects(runs, REFERENCE).set_index("effect")
    routing = effects.loc["routing 3 vs 1, no reconstruction"]
    assert not math.isnan(routing.ci_low) and routing.our_delta == pytest.approx(-0.1)  # aaaaaaa trained both
    assert routing.commit == "aaaaaaa"
    recon = effects.loc["reconstruction on vs off, routing 3"]  # r3_recon only at ccccccc, r3 only at aaaaaaa
    assert math.isnan(recon.ci_low) and recon.status == (
        "confounded: capsnet_r3_recon trained at fp 5555eeee: ccccccc (Adam ε 1e-08), capsnet_r3 at "
        "fp 3333cccc: aaaaaaa (Adam ε 1e-08), no commit in common")
    text = markdown(t1.summarize(runs, REFERENCE), t1.effects(runs, REFERENCE), profile="gpu", deviations=[],
                    provenance={}, figures={}, reference=REFERENCE, run_table=rr.run_provenance(runs))
    assert "| capsnet_r1 | paper | 1 | yes | fp 1234abcd: aaaaaaa, bbbbbbb | 3 |" in text
    assert "| capsnet_r1 | 1 | bbbbbbb2222 | 1234abcd5678ef90 |" in text  # each run's own record names both
    readme = t1.readme_lines(t1.summarize(runs, REFERENCE), t1.effects(runs, REFERENCE))
    lines = [line for line in readme if line.startswith("| paper recipe")]
    assert [line.split(" | ")[0] for line in lines] == ["| paper recipe (aaaaaaa)", "| paper recipe (ccccccc)"]
    assert lines[0].count(": ") == 6 and lines[1].count(": ") == 1  # r1, r3 and r1_recon's two rows (": " twice each)
    assert "| 1.00 ± –: one seed: no verdict; 1.20 ± –: one seed: no verdict |" in lines[0]  # neither hidden
    t1_figures.dvc_plot_data(runs, t1.summarize(runs, REFERENCE), tmp_path / "results", tmp_path)  # rows find their runs
    assert len(pd.read_csv(tmp_path / "confusion.csv")) == 1000


def two_commits(root, env_r1: str, env_r3: str) -> list:
    """capsnet_r1's three seeds trained at commit aaaaaaa1111 (fingerprint 1111aaaa…, recorded in
    ``env_r1``), capsnet_r3's at bbbbbbb2222 (3333cccc…, in ``env_r3``): two windows' rows, loaded."""
    for seed in (0, 1, 2):
        fabricate(root, "capsnet_r1", seed, 1.0 + seed / 10, n=1000, commit="aaaaaaa1111",
                  fingerprint="1111aaaa1111aaaa", fingerprint_env=env_r1)
        fabricate(root, "capsnet_r3", seed, 0.9 + seed / 10, n=1000, commit="bbbbbbb2222",
                  fingerprint="3333cccc3333cccc", fingerprint_env=env_r3)
    return load(root, ["capsnet_r1", "capsnet_r3"], [0, 1, 2])


def routing_effect(runs: list, tables: list[dict]):
    """The routing effect (3 vs 1, no reconstruction) with ``runs`` bridged through ``tables``."""
    return t1.effects(bridge(runs, tables), REFERENCE).set_index("effect").loc["routing 3 vs 1, no reconstruction"]


def test_a_fingerprint_table_lets_rows_of_two_commits_compare(tmp_path):
    """Two GPU windows: capsnet_r1 trained at one commit, capsnet_r3 at another, so their rows share
    no commit and their effect is confounded. A fingerprint table (`capsnet fingerprint`) of a commit
    whose code computes both rows' fingerprints in their environment bridges them: the effect gets
    its interval and names that commit, the row's label says which commit computes it, the README
    puts both on one line. A table of another environment, or one computing another fingerprint for
    either row, bridges nothing."""
    env = "torch 2.11.0, CPU AVX512"
    runs = two_commits(tmp_path, env, env)
    good = {"commit": "bbbbbbb2222", "environment": env,
            "fingerprints": {"capsnet_r1": "1111aaaa1111aaaa", "capsnet_r3": "3333cccc3333cccc"}}
    other_env = good | {"environment": "torch 2.11.0, CPU AVX2"}
    changed = {"commit": "ccccccc3333", "environment": env,
               "fingerprints": {"capsnet_r1": "9999aaaa9999aaaa", "capsnet_r3": "3333cccc3333cccc"}}

    def routing(tables):
        return routing_effect(runs, tables)

    for tables in ([], [other_env], [changed]):
        assert math.isnan(routing(tables).ci_low) and routing(tables).status.endswith("no commit in common"), tables
    bridged = routing([changed, good])
    assert not math.isnan(bridged.ci_low) and bridged.our_delta == pytest.approx(-0.1) and bridged.commit == "bbbbbbb"
    summary = t1.summarize(bridge(runs, [changed, good]), REFERENCE).set_index("variant")
    assert summary.loc["capsnet_r1"].commit == "fp 1111aaaa: aaaaaaa; computed by bbbbbbb"
    assert summary.loc["capsnet_r3"].commit == "fp 3333cccc: bbbbbbb; computed by ccccccc"  # its own commit once
    readme = t1.readme_lines(summary.reset_index(), t1.effects(bridge(runs, [good]), REFERENCE))
    assert [line.split(" | ")[0] for line in readme if line.startswith("| paper recipe")] == ["| paper recipe (bbbbbbb)"]
    (tmp_path / "tables").mkdir()
    for k, table in enumerate((good, changed)):
        (tmp_path / "tables" / f"{k}.json").write_text(json.dumps(table))
    assert lineage.load_tables(tmp_path / "tables") == [good, changed] and lineage.load_tables(tmp_path / "absent") == []


def test_a_table_of_a_runs_own_commit_carries_it_into_a_new_environment(tmp_path):
    """The fingerprint's environment changed between two windows (a new cap): capsnet_r1's runs, trained
    at commit A, recorded their fingerprint in the old environment, capsnet_r3's at commit B in the new
    one. B's table (new environment) bridges them only through A's own tables: A's in the old environment
    holding what the runs recorded (A's code trained them), A's in the new one holding what B computes for
    capsnet_r1 (scripts/fingerprint_at.py). Either missing, A's old table computing something else, or
    another commit's table holding what the runs recorded, and nothing is bridged (pipeline.core.lineage)."""
    old, new = "torch 2.11.0+cu130, CPU AVX2 capped", "torch 2.11.0+cu130, CPU AVX2 capped, MKL COMPATIBLE"
    runs = two_commits(tmp_path, old, new)
    a_old = {"commit": "aaaaaaa1111", "environment": old, "fingerprints": {"capsnet_r1": "1111aaaa1111aaaa"}}
    a_new = {"commit": "aaaaaaa1111", "environment": new, "fingerprints": {"capsnet_r1": "5555eeee5555eeee"}}
    b_new = {"commit": "bbbbbbb2222", "environment": new,
             "fingerprints": {"capsnet_r1": "5555eeee5555eeee", "capsnet_r3": "3333cccc3333cccc"}}
    a_old_other = a_old | {"fingerprints": {"capsnet_r1": "7777aaaa7777aaaa"}}

    def routing(tables):
        return routing_effect(runs, tables)

    bridged = routing([a_old, a_new, b_new])
    assert not math.isnan(bridged.ci_low) and bridged.commit == "bbbbbbb"
    a_old_elsewhere = a_old | {"commit": "ccccccc3333"}  # what A's runs recorded, but from another commit's code
    for tables in ([a_new, b_new], [a_old, b_new], [a_old_other, a_new, b_new], [a_old, a_new], [a_old_elsewhere, a_new, b_new]):
        assert math.isnan(routing(tables).ci_low) and routing(tables).status.endswith("no commit in common"), tables


def test_one_code_trained_again_on_another_host_is_one_row_and_each_seed_counts_once(tmp_path):
    """capsnet_r1 seeds 0-2 trained at commit A on a host whose processor fingerprints it 1111aaaa…, then
    seeds 0-1 again at commit B on another host (2222bbbb…, the 2026-11-27 capsnet_r3_recon rows): where
    A's table on the second host computes B's fingerprint, the code is one, so the rows are one (named by
    the fingerprint its last run recorded) and a seed of both is one seed trained again: the later run counts
    (`publish.one_per_seed`), three seeds, not five. Without that table: two rows, nothing superseded."""
    amd, intel = "torch 2.11.0+cu130, CPU AVX2 capped, MKL COMPATIBLE", "torch 2.11.0+cu130, CPU AVX2 capped, MKL COMPATIBLE "
    for seed in (0, 1, 2):
        fabricate(tmp_path / "a", "capsnet_r1", seed, 1.0 + seed / 10, n=1000, commit="aaaaaaa1111",
                  fingerprint="1111aaaa1111aaaa", fingerprint_env=amd)
    for seed in (0, 1):
        fabricate(tmp_path / "b", "capsnet_r1", seed, 2.0 + seed / 10, n=1000, commit="bbbbbbb2222",
                  fingerprint="2222bbbb2222bbbb", fingerprint_env=intel)
    fabricate(tmp_path / "c", "capsnet_r1", 0, 3.0, n=1000, commit="bbbbbbb2222", epochs=2,  # another protocol
              fingerprint="2222bbbb2222bbbb", fingerprint_env=intel)
    earlier, later = load(tmp_path / "a", ["capsnet_r1"], [0, 1, 2]), load(tmp_path / "b", ["capsnet_r1"], [0, 1])
    runs = sorted(earlier + later, key=lambda r: r.seed)  # as publish.with_earlier orders them: set aside first
    runs += load(tmp_path / "c", ["capsnet_r1"], [0])
    a_amd = {"commit": "aaaaaaa1111", "environment": amd, "fingerprints": {"capsnet_r1": "1111aaaa1111aaaa"}}
    a_intel = {"commit": "aaaaaaa1111", "environment": intel, "fingerprints": {"capsnet_r1": "2222bbbb2222bbbb"}}
    b_intel = {"commit": "bbbbbbb2222", "environment": intel, "fingerprints": {"capsnet_r1": "2222bbbb2222bbbb"}}
    kept, superseded = publish.one_per_seed(same_code(bridge(runs, [a_amd, a_intel, b_intel])))
    assert [(r.seed, r.commit[:7]) for r in superseded] == [(0, "aaaaaaa"), (1, "aaaaaaa")]
    summary = t1.summarize(kept, REFERENCE)
    assert sorted(summary.n_seeds) == [1, 3]  # the other protocol's run is a row of its own
    row = summary[summary.n_seeds == 3].iloc[0]
    assert row.test_errors == "2.00 2.10 1.20"
    assert row.commit == "fp 1111aaaa: bbbbbbb, aaaaaaa"  # the last run's (seed 2's) fingerprint, both commits
    kept, _ = publish.one_per_seed(same_code(bridge(earlier + later, [a_amd, a_intel, b_intel])))
    summary = t1.summarize(kept, REFERENCE)  # the second host's runs last: the row takes their fingerprint
    assert summary[summary.n_seeds == 3].iloc[0].commit.startswith("fp 2222bbbb: ")
    kept, superseded = publish.one_per_seed(same_code(bridge(runs, [a_amd, b_intel])))
    assert not superseded and sorted(t1.summarize(kept, REFERENCE).n_seeds) == [1, 2, 3]


def test_a_commits_table_from_another_host_is_kept_beside_the_one_published_never_over_it(tmp_path):
    """scripts/gpu_import.sh files each window's tables by name (`lineage.keep_tables`): the same commit's
    table from another environment (another GPU host) goes beside the published one, which still vouches
    for the runs trained there; the same table again replaces itself."""
    from pipeline.core import lineage

    published, window = tmp_path / "published", tmp_path / "window"
    window.mkdir()
    intel = {"commit": "c" * 40, "environment": "torch 2.11.0+cu130, CPU AVX2 capped, MKL COMPATIBLE, GenuineIntel, glibc 2.39",
             "fingerprints": {"capsnet_r1": "1" * 16}}
    amd = intel | {"environment": intel["environment"].replace("GenuineIntel, glibc 2.39", "AuthenticAMD, glibc 2.36"),
                   "fingerprints": {"capsnet_r1": "2" * 16}}
    (window / f"{'c' * 40}.json").write_text(json.dumps(intel))
    assert lineage.keep_tables(sorted(window.glob("*.json")), published) == [published / f"{'c' * 40}.json"]
    assert lineage.keep_tables(sorted(window.glob("*.json")), published) == [published / f"{'c' * 40}.json"]  # again: itself
    (window / f"{'c' * 40}.json").write_text(json.dumps(amd))
    (beside,) = lineage.keep_tables(sorted(window.glob("*.json")), published)
    assert beside.name.startswith("c" * 40 + "-") and sorted(p.name for p in published.iterdir()) == sorted(
        [f"{'c' * 40}.json", beside.name])
    assert sorted(t["environment"] for t in lineage.load_tables(published)) == sorted([intel["environment"], amd["environment"]])


def test_one_commits_tables_from_three_hosts_are_all_kept(tmp_path):
    """Each environment's table of one commit beside the published one gets a name of its own (the
    environment's hash): a third host's does not replace the second's."""
    from pipeline.core import lineage

    published, window = tmp_path / "published", tmp_path / "window"
    window.mkdir()
    name = f"{'c' * 40}.json"
    hosts = [f"torch 2.11.0+cu130, CPU AVX2 capped, host {k}" for k in range(3)]
    for k, environment in enumerate(hosts):
        (window / name).write_text(json.dumps({"commit": "c" * 40, "environment": environment,
                                               "fingerprints": {"capsnet_r1": str(k) * 16}}))
        lineage.keep_tables([window / name], published)
    assert len(list(published.iterdir())) == 3
    assert sorted(t["environment"] for t in lineage.load_tables(published)) == hosts


def test_an_effect_compares_the_pair_of_rows_with_the_most_seeds(tmp_path):
    """Two windows trained both variants, each at its own commit: one seed each, then three each. The
    effect compares the three-seed rows (with an interval), not the first pair that shares a commit."""
    early, late = tmp_path / "early", tmp_path / "late"
    fabricate(early, "capsnet_r1", 0, 2.0, n=1000, commit="aaaaaaa1111", fingerprint="1111aaaa1111aaaa")
    fabricate(early, "capsnet_r3", 0, 1.0, n=1000, commit="aaaaaaa1111", fingerprint="3333aaaa3333aaaa")
    for seed in (0, 1, 2):
        fabricate(late, "capsnet_r1", seed, 1.0 + seed / 10, n=1000, commit="bbbbbbb2222", fingerprint="1111bbbb1111bbbb")
        fabricate(late, "capsnet_r3", seed, 0.9 + seed / 10, n=1000, commit="bbbbbbb2222", fingerprint="3333bbbb3333bbbb")
    runs = load(early, ["capsnet_r1", "capsnet_r3"], [0]) + load(late, ["capsnet_r1", "capsnet_r3"], [0, 1, 2])
    routing = t1.effects(runs, REFERENCE).set_index("effect").loc["routing 3 vs 1, no reconstruction"]
    assert routing.commit == "bbbbbbb" and routing.n_seeds == 3 and routing.our_delta == pytest.approx(-0.1)
    assert not math.isnan(routing.ci_low)


def test_a_compressed_schedule_is_another_protocol_and_says_so(tmp_path):
    fabricate(tmp_path, "capsnet_r1", 0, 1.0, history=[2.0, 1.0])  # recorded before the key existed
    fabricate(tmp_path, "capsnet_r1", 1, 1.0, history=[2.0, 1.0], lr_schedule_epochs=0)  # uncompressed: the same
    fabricate(tmp_path, "capsnet_r3", 0, 1.0, history=[2.0, 1.0], lr_schedule_epochs=640)
    runs = load(tmp_path, ["capsnet_r1"], [0, 1]) + load(tmp_path, ["capsnet_r3"], [0])
    summary = t1.summarize(runs, REFERENCE).set_index("variant")
    assert summary.loc["capsnet_r1", "n_seeds"] == 2
    assert "0.96^(step/2000) ≥" in summary.loc["capsnet_r1", "protocol"]
    assert "0.96^(step/2000 · 640/2) ≥" in summary.loc["capsnet_r3", "protocol"]
    assert t1.effects(runs, REFERENCE).empty  # routing 3 vs 1 across two protocols: not compared
    compressed, cut = [d for d in rp.run_deviations(runs, ADAM_EPS) if "compressed" in d or "**cut**" in d]
    assert compressed.startswith("1 of 3 runs decay the learning rate of 640 epochs compressed into their 2")
    assert cut.startswith("2 of 3 runs trained the paper's schedule **cut** at 2 epochs") and "0.0009" in cut


def test_end_of_training_columns_are_labelled_a_diagnostic(tmp_path):
    fabricate(tmp_path, "capsnet_r1", 0, 0.4, history=[9, 9, 0.2, 0.6, 0.3, 0.5, 0.4])
    fabricate(tmp_path, "capsnet_r1", 1, 0.6, history=[9, 9, 0.6, 0.6, 0.6, 0.6, 0.6])
    runs = load(tmp_path, ["capsnet_r1"], [0, 1])
    row = t1.summarize(runs, REFERENCE).iloc[0]
    assert row.last5_errors == "0.40 0.60" and row.last5_error_mean == pytest.approx(0.5)  # epochs 3–7
    assert row.final_lr == pytest.approx(1e-3 * 0.9 ** 6)
    assert row.test_error_mean == pytest.approx(0.5)  # the headline stays the final epoch
    text = markdown(t1.summarize(runs, REFERENCE), t1.effects(runs, REFERENCE), profile="gpu",
                              deviations=["d"], provenance={}, figures={}, reference=REFERENCE)
    assert "A **stability diagnostic**, not a headline" in text
    assert "| capsnet_r1 | c0ffee0 | 0.50 | 0.50 | 0.40 0.60 | 0.00053 | 7 7 | 0.40 | 0.20@3 0.60@3 |" in text


def test_the_last_learning_rate_is_the_mean_over_a_rows_seeds(tmp_path):
    """A seed that stopped early (its history shorter than the epochs asked) ends at a higher rate."""
    fabricate(tmp_path, "capsnet_r1", 0, 0.4, history=[9, 9, 0.2, 0.6, 0.3, 0.5, 0.4])
    fabricate(tmp_path, "capsnet_r1", 1, 0.6, history=[9, 9, 0.6], epochs=7)
    [row] = t1.summarize(load(tmp_path, ["capsnet_r1"], [0, 1]), REFERENCE).itertuples()
    assert row.final_lr == pytest.approx(1e-3 * (0.9 ** 6 + 0.9 ** 2) / 2) and row.final_epochs == "7 3"


def test_a_row_lists_every_adam_eps_its_seeds_recorded_and_a_variant_the_paper_lacks_has_no_verdict(tmp_path):
    fabricate(tmp_path, "capsnet_r1", 0, 0.4)
    fabricate(tmp_path, "capsnet_r1", 1, 0.6, adam_eps=1e-7)
    fabricate(tmp_path, "capsnet_r3_wide", 0, 0.5)
    fabricate(tmp_path, "capsnet_r3_wide", 1, 0.7)
    table = t1.summarize(load(tmp_path, ["capsnet_r1", "capsnet_r3_wide"], [0, 1]), REFERENCE).set_index("variant")
    assert table.loc["capsnet_r1", "adam_eps"] == "1e-08; 1e-07"
    assert table.loc["capsnet_r3_wide", "verdict"] == "no paper value"
    assert math.isnan(table.loc["capsnet_r3_wide", "delta_ci_low"])


def test_missing_seed_is_named(tmp_path):
    fabricate(tmp_path, "capsnet_r1", 0, 1.0)
    with pytest.raises(rr.ReportError, match="variant capsnet_r1 seed 1 has no evaluation"):
        load(tmp_path, ["capsnet_r1"], [0, 1])
    with pytest.raises(rr.ReportError, match="variant capsnet_r3 seed 0"):
        load(tmp_path, ["capsnet_r1", "capsnet_r3"], [0])


def test_a_missing_evaluation_names_the_stage_that_exists(tmp_path):
    """The hint is the evaluate stage dvc.yaml's matrices make of params.yaml's ablation: stacked
    variants (the CapsNets) are evaluate_stacked@…, separate ones (the CNNs) evaluate@…."""
    from conftest import REPO

    from pipeline.core import stage_names as stages
    from pipeline.core.params import load_params

    params = load_params(REPO / "params.yaml")
    assert "capsnet_r1" in params.ablation.stacked and "baseline_cnn" in params.ablation.separate
    for variant, stage in (("capsnet_r1", "evaluate_stacked@capsnet_r1-0"), ("baseline_cnn", "evaluate@baseline_cnn-0")):
        with pytest.raises(rr.ReportError, match=f"run `dvc repro -f {stage}`"):
            load(tmp_path, [variant], [0], params=params)
        assert stage in stages.stage_names(params, variant if variant in params.ablation.stacked else f"{variant}-0")


@pytest.mark.parametrize("profile", ["smoke", "paper"])
def test_smoke_banner_only_in_smoke_reports(tmp_path, profile):
    fabricate(tmp_path, "capsnet_r1", 0, 1.0)
    runs = load(tmp_path, ["capsnet_r1"], [0])
    text = markdown(t1.summarize(runs, REFERENCE), t1.effects(runs, REFERENCE), profile=profile,
                              deviations=["d"], provenance={"commit": "x"}, figures={}, reference=REFERENCE)
    assert (rp.SMOKE_BANNER in text) == (profile == "smoke")
    assert "0.34 ± 0.032" in text  # the paper's value comes from the cited reference file


def test_recipe_differences_list_only_changes():
    recipe = {k: v for k, v in REFERENCE["recipe"].items() if k != "source"}
    assert t1.recipe_differences(recipe, REFERENCE) == []
    assert t1.recipe_differences({**recipe, "epochs": 50}, REFERENCE) == ["train.epochs = 50 (paper protocol: 640)"]


# --- §5.2 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("lo,hi,expected", [
    (0.0, 20.0, "no difference shown"),   # touches 0
    (-1.0, 2.0, "no difference shown"),
    (-3.35, -1.07, "opposite"),           # wholly below 0: the CNN is more accurate (the published runs)
    (-3.0, 0.0, "no difference shown"),   # reaching 0 is covering it
    (math.nan, math.nan, "one seed: no verdict"),
    (1.0, 12.9, "smaller gap"),      # above 0, wholly below the paper's 13 pp
    (1.0, 13.0, "reproduced"),       # reaches the paper's gap exactly
    (12.0, 15.0, "reproduced"),
    (13.0, 15.0, "reproduced"),      # contains 13 at its lower end
    (13.1, 15.0, "larger gap"),
])
def test_gap_verdict_boundaries(lo, hi, expected):
    assert ra.gap_verdict(lo, hi, 13.0) == expected


def test_affnist_summary_gap_and_matched_flag(tmp_path):
    # CapsNet: 1 % / 21 % error on expanded / affNIST; CNN: 1 % / 36 %; the CNN errs on a superset of
    # the CapsNet's affNIST images, so every paired difference is 0 or +1 and the gap is exactly +15 pp.
    for seed in (0, 1):
        fabricate(tmp_path, "capsnet_affnist", seed, 1.0, n=400, affine_pct=21.0, image_size=40, stop_reason="target")
        fabricate_cnn_affnist(tmp_path, seed, n=400, affine_pct=36.0, stop_reason="budget" if seed else "target")
    runs = load(tmp_path, ["capsnet_affnist", "cnn_affnist"], [0, 1])
    table = ra.affnist_summary(runs, REFERENCE).set_index("variant")
    assert table.loc["capsnet_affnist", "affnist_acc_mean"] == pytest.approx(79.0)
    assert table.loc["cnn_affnist", "affnist_acc_mean"] == pytest.approx(64.0)
    assert table.loc["capsnet_affnist", "expanded_acc_mean"] == pytest.approx(99.0)
    assert table.loc["cnn_affnist", "stopped"] == "1 1*"
    assert table.loc["capsnet_affnist", "paper_affnist_acc"] == 79.0 and table.loc["cnn_affnist", "paper_affnist_acc"] == 66.0
    gap = ra.affnist_gap(runs, REFERENCE)
    assert gap["gap"] == pytest.approx(15.0) and gap["paper_gap"] == pytest.approx(13.0)
    assert 0 < gap["ci_low"] < 13 < 15 < gap["ci_high"] and gap["verdict"] == "reproduced"
    assert gap["matched"] is False  # the CNN's seed 1 ran out of budget
    text = "\n".join(ra.render_affnist(ra.affnist_summary(runs, REFERENCE), gap, REFERENCE))
    assert "Verdict: reproduced" in text and "not compared at matched" in text
    assert "affNIST-style set" in text  # the fabricated source is not the real affNIST
    csv = ra.with_gap(ra.affnist_summary(runs, REFERENCE), gap)
    assert list(csv.gap_verdict) == ["reproduced"] * 2 and list(csv.gap_pp) == pytest.approx([15.0, 15.0])


def test_affnist_gap_across_commits_is_confounded(tmp_path):
    for seed in (0, 1):
        fabricate(tmp_path, "capsnet_affnist", seed, 1.0, affine_pct=21.0, image_size=40, commit="aaaaaaa")
        fabricate_cnn_affnist(tmp_path, seed, affine_pct=36.0, commit="bbbbbbb")
    gap = ra.affnist_gap(load(tmp_path, ["capsnet_affnist", "cnn_affnist"], [0, 1]), REFERENCE)
    assert gap["gap"] == pytest.approx(15.0) and math.isnan(gap["ci_low"])
    assert gap["verdict"] == "confounded (protocols or training code differ: aaaaaaa, bbbbbbb)"


def test_affnist_gap_of_two_fingerprints_from_one_commit_has_an_interval(tmp_path):
    """The two models' fingerprints always differ; runs of both from one commit's code compare."""
    for seed in (0, 1):
        fabricate(tmp_path, "capsnet_affnist", seed, 1.0, affine_pct=21.0 + seed, image_size=40, commit="aaaaaaa1",
                  fingerprint="1111aaaa1111aaaa")
        fabricate_cnn_affnist(tmp_path, seed, affine_pct=36.0 + seed, commit="bbbbbbb2" if seed else "aaaaaaa1",
                              fingerprint="2222bbbb2222bbbb")
    gap = ra.affnist_gap(load(tmp_path, ["capsnet_affnist", "cnn_affnist"], [0, 1]), REFERENCE)
    assert not math.isnan(gap["ci_low"]) and "confounded" not in gap["verdict"]


def test_affnist_gap_reads_the_protocol_both_models_have_most_runs_of_and_names_it(tmp_path):
    """A §5.2 seed a later window trained under another protocol neither joins the gap nor makes it
    confounded: the gap reads the headline protocol's runs and names that protocol, and the claim says
    so where Table 1's headline protocol is another."""
    for seed in (0, 1):
        fabricate(tmp_path, "capsnet_affnist", seed, 1.0, affine_pct=21.0 + seed, image_size=40)
        fabricate_cnn_affnist(tmp_path, seed, affine_pct=36.0 + seed)
    fabricate(tmp_path, "capsnet_affnist", 2, 1.0, affine_pct=90.0, image_size=40, lr_schedule_epochs=640)
    runs = load(tmp_path, ["capsnet_affnist"], [2]) + load(tmp_path, ["capsnet_affnist", "cnn_affnist"], [0, 1])
    gap = ra.affnist_gap(runs, REFERENCE)
    assert gap["gap"] == pytest.approx(15.0) and not math.isnan(gap["ci_low"]) and gap["seeds"] == [0, 1]
    assert gap["protocol"] == runs[1].protocol and "640/" not in gap["protocol"]
    assert [r.seed for r in ra.headline_runs(runs)] == [0, 1, 0, 1]  # the figure's runs too
    claims = rc.gap_claim(gap)
    table1_headline = runs[0].protocol  # the compressed schedule's
    assert f"(affNIST-style set), under {gap['protocol']} |" in "\n".join(rc.render_claims(claims, table1_headline))
    assert "under" not in "\n".join(rc.render_claims(claims, gap["protocol"]))
    table = ra.affnist_summary(runs, REFERENCE)  # the headline protocol's rows first, each naming its protocol
    assert list(zip(table.variant, table.n_seeds)) == [("capsnet_affnist", 2), ("cnn_affnist", 2), ("capsnet_affnist", 1)]
    text = "\n".join(ra.render_affnist(table, gap, REFERENCE))
    assert f"| capsnet_affnist | {COMMIT[:7]}; {runs[0].protocol} | " in text
    from pipeline.experiments import affnist

    (tmp_path / "affnist.csv").write_text(ra.with_gap(table, gap).to_csv(index=False))
    [line] = affnist.readme(tmp_path)  # the README names the rows the gap reads, not the begun protocol's
    assert line.endswith("capsnet_affnist 78.5 ± 0.7 %; cnn_affnist 63.5 ± 0.7 %."), line


def test_affnist_gap_reads_one_variant_per_model_and_names_every_seed_and_the_real_set(tmp_path):
    """§5.2's gap compares the first CapsNet variant with the first CNN (a second CapsNet variant stays
    out), names every seed of both, counts the seeds of the model with fewer, and calls the real affNIST
    by its name; its rows name their fingerprint and commit, a row with one seed has no std, and
    all_reached_target needs every seed at the target. Without a gap the table is as it was."""
    for seed in (0, 1):
        fabricate(tmp_path, "capsnet_affnist", seed, 1.0, n=400, affine_pct=21.0, image_size=40, stop_reason="target",
                  fingerprint="1111aaaa1111aaaa")
    for seed in (0, 1, 2):
        fabricate_cnn_affnist(tmp_path, seed, n=400, affine_pct=36.0, stop_reason="budget" if seed == 2 else "target",
                              fingerprint="2222bbbb2222bbbb")
    fabricate(tmp_path, "capsnet_affnist_wide", 0, 2.0, n=400, affine_pct=90.0, image_size=40)
    runs = (load(tmp_path, ["capsnet_affnist"], [0, 1]) + load(tmp_path, ["capsnet_affnist_wide"], [0])
            + load(tmp_path, ["cnn_affnist"], [0, 1, 2]))
    for r in runs:
        r.breakdown["sources"]["affnist_test"] = "affNIST test set (the real one)"
    gap = ra.affnist_gap(runs, REFERENCE)
    assert (gap["capsnet"], gap["cnn"], gap["gap"]) == ("capsnet_affnist", "cnn_affnist", pytest.approx(15.0))
    assert gap["seeds"] == [0, 1, 2] and gap["n_seeds"] == 2 and gap["set"] == "real affNIST"
    table = ra.affnist_summary(runs, REFERENCE).set_index("variant")
    assert table.loc["capsnet_affnist", "commit"] == f"fp 1111aaaa: {COMMIT[:7]}"
    assert math.isnan(table.loc["capsnet_affnist_wide", "expanded_acc_std"])
    assert math.isnan(table.loc["capsnet_affnist_wide", "affnist_acc_std"])
    assert table.all_reached_target.to_dict() == {"capsnet_affnist": True, "capsnet_affnist_wide": False,
                                                  "cnn_affnist": False}
    assert ra.with_gap(table, None) is table


def test_the_readme_line_of_52_names_the_set_the_models_were_tested_on(tmp_path):
    from pipeline.experiments import affnist

    for seed in (0, 1):
        fabricate(tmp_path, "capsnet_affnist", seed, 1.0, n=400, affine_pct=21.0, image_size=40)
        fabricate_cnn_affnist(tmp_path, seed, n=400, affine_pct=36.0)
    runs = load(tmp_path, ["capsnet_affnist", "cnn_affnist"], [0, 1])
    for source, named in (("affnist_test (fabricated)", "the affNIST-style set"),
                          ("affNIST test set (320,000 images from test.mat)", "the real affNIST")):
        for r in runs:
            r.breakdown["sources"]["affnist_test"] = source
        table = ra.with_gap(ra.affnist_summary(runs, REFERENCE), ra.affnist_gap(runs, REFERENCE))
        (tmp_path / "affnist.csv").write_text(table.to_csv(index=False))
        [line] = affnist.readme(tmp_path)
        assert line.startswith(f"§5.2, CapsNet − CNN accuracy on {named}: +15.00 pp ["), line


def test_the_52_section_bins_the_headline_runs_rounds_its_metric_and_keeps_its_deviation(tmp_path, monkeypatch):
    from conftest import committed_params
    from pipeline.experiments import affnist

    def bins(acc):
        return {"affnist_test": {"rotation_deg": {"edges": [-20, 20], "count": [5], "accuracy_pct": [acc]}}}

    for seed in (0, 1):
        fabricate(tmp_path, "capsnet_affnist", seed, 1.0, affine_pct=21.0 + seed, image_size=40, bins=bins(50.0))
        fabricate_cnn_affnist(tmp_path, seed, affine_pct=36.0, bins=bins(40.0))
    fabricate(tmp_path, "capsnet_affnist", 2, 1.0, image_size=40, bins=bins(90.0), lr_schedule_epochs=640)  # begun
    runs = load(tmp_path, ["capsnet_affnist", "cnn_affnist"], [0, 1]) + load(tmp_path, ["capsnet_affnist"], [2])
    drawn = {}
    monkeypatch.setattr(affnist.figures, "accuracy_by_transform", lambda *args: drawn.update(args=args))
    params = committed_params(affnist_transforms=3)
    (tmp_path / "figures").mkdir()
    section = affnist.report(runs, rp.Context(params, REFERENCE, [], tmp_path / "results", tmp_path))
    binned = drawn["args"][0]
    assert binned["capsnet_affnist"]["rotation_deg"]["accuracy_pct"] == [50.0]  # not the begun protocol's 90
    assert section.deviations == affnist.deviations_of(params) != []
    metric = section.headline["affnist_gap_pp"]
    assert metric["gap"] == 14.5 and all(v == round(v, 4) for v in metric.values())


def test_the_52_readme_line_needs_a_gap_and_a_confounded_one_lists_every_row(tmp_path):
    from pipeline.experiments import affnist

    fabricate(tmp_path, "capsnet_affnist", 0, 1.0, affine_pct=21.0, image_size=40)
    fabricate(tmp_path, "capsnet_affnist", 1, 1.0, affine_pct=23.0, image_size=40)
    fabricate_cnn_affnist(tmp_path, 0, affine_pct=36.0, lr_schedule_epochs=640)
    capsnets, cnn = load(tmp_path, ["capsnet_affnist"], [0, 1]), load(tmp_path, ["cnn_affnist"], [0])
    one_model = ra.with_gap(ra.affnist_summary(capsnets, REFERENCE), None)
    (tmp_path / "affnist.csv").write_text(one_model.to_csv(index=False))
    assert affnist.readme(tmp_path) == []  # one model: no gap to state
    both = capsnets + cnn
    table = ra.with_gap(ra.affnist_summary(both, REFERENCE), ra.affnist_gap(both, REFERENCE))
    (tmp_path / "affnist.csv").write_text(table.to_csv(index=False))
    [line] = affnist.readme(tmp_path)
    assert "**confounded" in line and line.endswith("capsnet_affnist 78.0 ± 1.4 %; cnn_affnist 64.0 ± – %.")


def test_affnist_gap_reads_a_protocol_both_models_trained_under_or_calls_the_gap_confounded(tmp_path):
    """A protocol only the CapsNet trained under, however many its runs, is not the gap's; where no
    protocol has both models the gap reads them all and is confounded, though one commit trained both."""
    for seed in (0, 1, 2):
        fabricate(tmp_path / "long", "capsnet_affnist", seed, 1.0, affine_pct=21.0, image_size=40,
                  lr_schedule_epochs=640)
    fabricate(tmp_path / "both", "capsnet_affnist", 3, 1.0, affine_pct=21.0, image_size=40)
    fabricate_cnn_affnist(tmp_path / "both", 3, affine_pct=36.0)
    long = load(tmp_path / "long", ["capsnet_affnist"], [0, 1, 2])
    both = load(tmp_path / "both", ["capsnet_affnist", "cnn_affnist"], [3])
    gap = ra.affnist_gap(long + both, REFERENCE)
    assert gap["seeds"] == [3] and gap["protocol"] == both[0].protocol and gap["verdict"] == "one seed: no verdict"
    apart = ra.affnist_gap(long + both[1:], REFERENCE)  # the CNN's only protocol is not the CapsNet's
    assert apart["gap"] == pytest.approx(15.0) and math.isnan(apart["ci_low"])
    assert apart["verdict"] == f"confounded (protocols or training code differ: {COMMIT[:7]})"
    text = "\n".join(ra.render_affnist(ra.affnist_summary(long + both[1:], REFERENCE), apart, REFERENCE))
    assert "**CapsNet − CNN on affNIST(-style): +15.00 pp**, no interval (seed-aware" in text


def test_transform_bins_average_over_seeds(tmp_path):
    def bins(acc):
        return {"affnist_test": {"rotation_deg": {"edges": [-20, 0, 20], "count": [5, 5], "accuracy_pct": acc}}}

    fabricate(tmp_path, "capsnet_affnist", 0, 1.0, image_size=40, bins=bins([50.0, None]))
    fabricate(tmp_path, "capsnet_affnist", 1, 1.0, image_size=40, bins=bins([70.0, 80.0]))
    runs = load(tmp_path, ["capsnet_affnist"], [0, 1])
    out = ra.transform_bins(runs, "affnist_test")["capsnet_affnist"]["rotation_deg"]
    assert out["centres"] == [-10.0, 10.0]
    assert out["accuracy_pct"] == pytest.approx([60.0, 80.0])  # an empty bin is skipped, not counted as 0


def test_deviations_name_profile_changes_including_the_affnist_set():
    from conftest import REPO, committed_params
    from pipeline.core.params import load_params

    from pipeline.experiments import affnist

    committed = load_params(REPO / "params.yaml")
    assert not any("Data subsets" in d for d in t1.deviations(committed, REFERENCE))
    assert affnist.deviations_of(committed) == []
    smoke = committed_params(affnist_transforms=1, test_subset=256)
    assert any("256 test digits" in d for d in t1.deviations(smoke, REFERENCE))
    assert any("1 transform(s) per test digit" in d for d in affnist.deviations_of(smoke))  # §5.2's own


def test_deviations_name_a_multimnist_test_set_smaller_than_the_papers():
    from conftest import REPO, committed_params
    from pipeline.core.params import load_params
    from pipeline.experiments import multimnist as mm
    from pipeline.models.baseline import MULTIMNIST_DEVIATIONS

    committed = load_params(REPO / "params.yaml")  # 1,000 partners per digit: the paper's 10M pairs
    assert not any("MultiMNIST test set" in d for d in mm.deviations_of(committed))
    gpu = committed_params(multimnist_pairs_per_digit=100)
    (line,) = [d for d in mm.deviations_of(gpu) if "MultiMNIST test set" in d]
    assert "100 partners per test digit, 1,000,000 pairs" in line and "SE ≤ 0.050 pp" in line  # √(¼ / 1e6) = 0.0005
    assert all(d in mm.deviations_of(gpu) for d in MULTIMNIST_DEVIATIONS + mm.DEVIATIONS)  # its CNN's, its sampling's
    no_multi = with_ablation(gpu, stacked=(), separate=("capsnet_r1",))
    assert not any("MultiMNIST" in d for d in mm.deviations_of(no_multi))


def test_missing_runs_are_listed_not_estimated(tmp_path):
    fabricate(tmp_path, "capsnet_r1", 0, 1.0)
    fabricate(tmp_path, "capsnet_r1", 1, 2.0)
    fabricate(tmp_path, "capsnet_r3", 0, 1.0)
    (tmp_path / "results" / "capsnet_r3" / "seed0" / "predictions.safetensors").unlink()  # stopped before evaluation
    missing = rr.missing_runs(tmp_path / "models", tmp_path / "results", ["capsnet_r1", "capsnet_r3"], [0, 1])
    assert missing == [("capsnet_r3", 0), ("capsnet_r3", 1)]
    runs = load(tmp_path, ["capsnet_r1", "capsnet_r3"], [0, 1], skip=missing)
    assert [(r.variant, r.seed) for r in runs] == [("capsnet_r1", 0), ("capsnet_r1", 1)]
    text = markdown(t1.summarize(runs, REFERENCE), t1.effects(runs, REFERENCE), profile="gpu",
                              not_run={"capsnet_r3": [0, 1]}, deviations=["d"], provenance={"commit": "x"},
                              figures={}, reference=REFERENCE)
    assert "## Not run" in text and "- capsnet_r3: seed(s) 0, 1" in text
    assert "| capsnet_r3 |" not in text.split("## Not run")[0]  # no row, no estimate


def test_an_empty_run_table_adds_no_section_and_a_value_not_there_prints_as_a_dash():
    text = rp.render([], profile="gpu", figures={}, deviations=[], provenance={},
                     run_table=pd.DataFrame(columns=["variant", "seed"]))
    assert "Each run as it recorded itself" not in text
    assert (rp.fmt_pct(None), rp.fmt_pct(math.nan), rp.fmt_pct(0.254, 1)) == ("–", "–", "0.3")


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


def test_both_recipes_side_by_side_with_best_epoch_column(tmp_path):
    for seed, (err, history) in enumerate([(1.0, [3.0, 0.5, 1.0]), (2.0, [2.5, 2.0, 2.0])]):
        fabricate(tmp_path, "capsnet_r3_recon", seed, err, history=history)
        fabricate(tmp_path, "capsnet_r3_recon_official", seed, 0.5, recipe="official", history=[1.0, 0.5], epochs=3)
    variants = ["capsnet_r3_recon", "capsnet_r3_recon_official"]
    runs = load(tmp_path, variants, [0, 1])
    summary = t1.summarize(runs, REFERENCE).set_index("variant")
    paper, official = summary.loc["capsnet_r3_recon"], summary.loc["capsnet_r3_recon_official"]
    assert paper.recipe == "paper" and official.recipe == "official"  # a config without recipe is the paper's
    assert official.paper_test_error == 0.25 and official.verdict == "not reproduced"  # Table 1's r3+recon row
    assert official.reruns == "" and "XifengGuo" in paper.reruns
    assert paper.test_error_mean == pytest.approx(1.5)  # the final epoch's evaluation, not the best
    assert paper.best_errors == "0.50@2 2.00@2" and paper.best_error_mean == pytest.approx(1.25)
    assert paper.final_epochs == "3 3"
    effect = t1.effects(runs, REFERENCE).set_index("effect").loc["official vs paper recipe, routing 3, with reconstruction"]
    assert effect.our_delta == pytest.approx(-1.0) and np.isnan(effect.paper_delta)
    text = markdown(t1.summarize(runs, REFERENCE), t1.effects(runs, REFERENCE), profile="gpu",
                              deviations=["d"], provenance={}, figures={}, reference=REFERENCE)
    assert "| capsnet_r3_recon_official | official | 3 | yes | c0ffee0 | 2 | 0.50 ± 0.00 |" in text
    assert "| capsnet_r3_recon | paper | 3 | yes | c0ffee0 | 2 | 1.50 ± 0.71 |" in text
    assert "selected on the test set, so it is optimistic" in text
    assert "| capsnet_r3_recon | c0ffee0 | 1.50 | 1.83 | 1.50 2.17 | 0.00081 | 3 3 | 1.25 | 0.50@2 2.00@2 |" in text
    assert "| official vs paper recipe, routing 3, with reconstruction | – (no number) | -1.00 |" in text


def test_deviations_list_each_recipe_present():
    from conftest import REPO
    from pipeline.models import capsnet
    from pipeline.core.params import load_params

    committed = load_params(REPO / "params.yaml")
    listed = t1.deviations(committed, REFERENCE)
    assert all(d in listed for d in capsnet.PAPER_RECIPE_DEVIATIONS + capsnet.OFFICIAL_RECIPE_DEVIATIONS)
    paper_only = with_ablation(committed, stacked=(), separate=("capsnet_r1",))
    listed = t1.deviations(paper_only, REFERENCE)
    assert capsnet.PAPER_RECIPE_DEVIATIONS[0] in listed and capsnet.OFFICIAL_RECIPE_DEVIATIONS[0] not in listed


def test_an_official_recipe_alone_lists_no_paper_recipe_deviation_and_speeds_cite_only_what_priced_a_plan():
    from conftest import REPO
    from pipeline.core.params import load_params
    from pipeline.models import capsnet

    committed = load_params(REPO / "params.yaml")
    official = with_ablation(committed, stacked=(), separate=("capsnet_r1_official",))
    listed = t1.deviations(official, REFERENCE)
    assert capsnet.OFFICIAL_RECIPE_DEVIATIONS[0] in listed and capsnet.PAPER_RECIPE_DEVIATIONS[0] not in listed
    row = {"n_seeds": 3, "mde": 0.1, "seeds_needed": "–", "paper_protocol_hours": math.nan,
           "equivalence_seeds": "–", "equivalence_paper_protocol_hours": math.nan}
    effects = pd.DataFrame([  # the routing plan has no estimate; the recipes' is priced by its equivalence plan
        row | {"effect": "routing 3 vs 1, with reconstruction", "paper_delta": -0.04, "gpu_hours": math.nan,
               "equivalence_hours": math.nan, "cost_source": "S | capsnet_r1_recon eager fp32: 1 images/s"},
        row | {"effect": "official vs paper recipe, routing 3, with reconstruction", "paper_delta": math.nan,
               "gpu_hours": math.nan, "equivalence_hours": 2.0, "equivalence_seeds": "30",
               "cost_source": "S | capsnet_r3_recon bf16: 24,000 images/s"}])
    lines = t1._effect_power_lines(effects)
    assert lines[-1] == "Speeds: reports/benchmarks.md, S: capsnet_r3_recon bf16: 24,000 images/s."
    verdicts = pd.DataFrame([{"variant": "capsnet_r1", "commit": COMMIT, "n_seeds": 3, "delta": 0.5,
                              "verdict": "consistent", "equivalence_margin": 0.9, "seeds_to_separate": "more than 100",
                              "gpu_hours_to_separate": math.nan,
                              "cost_source": "S | capsnet_r1 eager fp32: 1 images/s"}])  # unpriced: no citation
    assert not any(line.startswith("Speeds:") for line in t1._verdict_power_lines(verdicts))


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


def test_the_claims_table_is_read_under_the_first_sections_protocol(tmp_path):
    """Table 1's section comes first and heads the Claims table; a later section's claims (§5.2's
    runs can lag a protocol behind) name their own protocol."""
    def claims(name, protocol):
        return pd.DataFrame([{"claim": name, "paper": "p", "ours": "o", "status": "s", "evidence": "",
                              "cost_source": "", "gpu_hours": math.nan, "protocol": protocol}], columns=rc.COLUMNS)

    sections = [rp.Section(lines=["## Table 1"], claims=claims("routing helps", "A"), protocol="A"),
                rp.Section(lines=["## §5.2"], claims=claims("robust to affine", "B"), protocol="B")]
    text = rp.render(sections, profile="gpu", figures={}, deviations=[], provenance={})
    assert "Under the first protocol below (A)." in text
    assert "| routing helps | p | o | s |" in text and "| robust to affine | p | o, under B | s |" in text


def test_report_stage_reads_its_fingerprint_tables(tmp_path, monkeypatch):
    """`capsnet report --fingerprints DIR`: the tables there bridge rows of two commits (effects.csv
    gets the interval); without the option the effect stays confounded."""
    from click.testing import CliRunner

    from conftest import REPO
    from pipeline.cli import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    env = "torch 2.11.0, CPU AVX512"
    for seed in (0, 1):
        fabricate(tmp_path, "capsnet_r1", seed, 1.0 + seed, recon=False, commit="aaaaaaa1111",
                  fingerprint="1111aaaa1111aaaa", fingerprint_env=env)
        fabricate(tmp_path, "capsnet_r3", seed, 0.5 + seed, recon=False, commit="bbbbbbb2222",
                  fingerprint="3333cccc3333cccc", fingerprint_env=env)
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["ablation"] |= {"stacked": [], "separate": ["capsnet_r1", "capsnet_r3"], "seeds": [0, 1]}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "bbbbbbb2222.json").write_text(json.dumps(
        {"commit": "bbbbbbb2222", "environment": env,
         "fingerprints": {"capsnet_r1": "1111aaaa1111aaaa", "capsnet_r3": "3333cccc3333cccc"}}))

    def routing(*extra):
        out = tmp_path / f"reports{len(extra)}"
        done = CliRunner().invoke(main, ["report", str(tmp_path / "models"), str(tmp_path / "results"), str(out),
                                         "--params", str(tmp_path / "params.yaml"), *extra])
        assert done.exit_code == 0, done.output
        return pd.read_csv(out / "effects.csv").set_index("effect").loc["routing 3 vs 1, no reconstruction"]

    assert routing().status.startswith("confounded")
    bridged = routing("--fingerprints", str(tmp_path / "tables"))
    assert bridged.commit == "bbbbbbb" and not math.isnan(bridged.ci_low)


def test_variant_metrics_never_pool_protocols_or_training_code(tmp_path):
    """reports/metrics (DVC metrics, and the report run's MLflow metrics): one file per report row, so
    a variant trained under two protocols or at two commits is two files, each its own seeds' mean;
    a variant with one row keeps its plain name."""
    from pipeline.stages import report as report_stage

    other = "beef" * 10
    fabricate(tmp_path, "capsnet_r3_recon", 0, 1.0)
    fabricate(tmp_path, "capsnet_r3_recon", 1, 2.0)
    fabricate(tmp_path, "capsnet_r3_recon", 2, 4.0, commit=other)  # other training code: a row of its own
    fabricate(tmp_path, "capsnet_r1", 0, 1.0, lr_schedule_epochs=640)  # one commit, two schedules
    fabricate(tmp_path, "capsnet_r1", 1, 3.0)
    fabricate(tmp_path, "capsnet_r3", 0, 1.0)
    fabricate(tmp_path, "capsnet_r3", 1, 2.0)
    runs = load(tmp_path, ["capsnet_r3_recon"], [0, 1, 2]) + load(tmp_path, ["capsnet_r1", "capsnet_r3"], [0, 1])
    written = report_stage.write_variant_metrics(runs, tmp_path / "metrics")
    errors = {name: m["error_pct"] for name, m in written.items()}
    r1 = sorted(n for n in errors if n.startswith("capsnet_r1-"))
    assert len(r1) == 2 and {errors[n] for n in r1} == {1.0, 3.0} and all(n.startswith(f"capsnet_r1-1ep-{COMMIT[:7]}-") for n in r1)
    assert errors == {f"capsnet_r3_recon-1ep-{COMMIT[:7]}": 1.5, f"capsnet_r3_recon-1ep-{other[:7]}": 4.0,
                      **{n: errors[n] for n in r1}, "capsnet_r3": 1.5}
    assert sorted(p.stem for p in (tmp_path / "metrics").iterdir()) == sorted(errors)


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


def test_a_rows_metrics_keep_a_shared_value_as_recorded_and_leave_out_a_key_a_seed_lacks(tmp_path):
    """metrics/<row>.json: a value every seed shares is written as recorded (a count stays an integer,
    reached_target a boolean), one that differs is the mean; a key one seed's metrics lack is left out."""
    from pipeline.stages import report as report_stage

    for seed in (0, 1):
        fabricate(tmp_path, "capsnet_r3", seed, 1.0 + seed)
    lacking = tmp_path / "results" / "capsnet_r3" / "seed1" / "metrics.json"
    lacking.write_text(json.dumps({k: v for k, v in json.loads(lacking.read_text()).items() if k != "n_params"}))
    report_stage.write_variant_metrics(load(tmp_path, ["capsnet_r3"], [0, 1]), tmp_path / "metrics")
    text = (tmp_path / "metrics" / "capsnet_r3.json").read_text()
    assert json.loads(text) == {"error_pct": 1.5, "transformed_error_pct": 50.0, "n_test": 200, "n_transformed": 200,
                                "epochs_trained": 1, "reached_target": False}
    assert '"n_test": 200,' in text and '"reached_target": false' in text


def test_the_learning_curves_draw_one_panel_per_protocol_and_each_schedules_longest_run(tmp_path, monkeypatch):
    """An experiment trained under one protocol gets its plain title; the learning-rate line of a schedule
    is its longest run's, whichever run came first."""
    from pipeline.stages import report as report_stage

    fabricate(tmp_path, "capsnet_r1", 0, 1.0, history=[3.0, 2.0, 1.0], epochs=3)
    fabricate(tmp_path, "capsnet_r1", 1, 1.0, history=[2.0, 1.0], epochs=3)
    drawn = {}
    monkeypatch.setattr(report_stage.figures, "learning_curve_panels",
                        lambda panels, lr, path: drawn.update(panels=panels, lr=lr))
    report_stage.learning_curves([("MNIST", load(tmp_path, ["capsnet_r1"], [0, 1]))], tmp_path / "curves.png")
    assert list(drawn["panels"]) == ["MNIST"] and [epochs for epochs, _ in drawn["lr"].values()] == [[1, 2, 3]]


def test_the_report_stage_needs_a_run_lists_the_missing_names_a_superseded_record_and_logs_every_file(
        tmp_path, monkeypatch, capsys):
    """With no evaluation it stops in one line saying what to run; `--missing list` reports the seeds that
    have none; a seed trained again says which record no longer counts; the README block is rewritten;
    the report run logs every table and figure, with each section's headline metrics."""
    from conftest import REPO
    from pipeline.core import tracking
    from pipeline.core.errors import UserError
    from pipeline.core.params import load_params
    from pipeline.stages import report as report_stage

    p = with_ablation(load_params(REPO / "params.yaml"), stacked=(), seeds=(0, 1),
                      separate=("capsnet_r1", "capsnet_affnist", "cnn_affnist"))
    with pytest.raises(UserError, match="no variant of params.yaml's ablation has an evaluation .* --missing list"):
        report_stage.run(p, tmp_path / "models", tmp_path / "results", tmp_path / "reports", missing="list")
    fabricate(tmp_path, "capsnet_r1", 0, 1.0, recon=False)
    fabricate(tmp_path, "capsnet_affnist", 0, 1.0, image_size=40)
    fabricate_cnn_affnist(tmp_path, 0)
    logged = {}

    class Tracker:
        def log_report(self, files, profile, metrics):
            logged.update(files=files, metrics=metrics)

    monkeypatch.setattr(tracking, "open_tracker", lambda profile: Tracker())
    # one_per_seed stubbed to call the one record superseded (its own tests say which record is): what the
    # stage prints of it is checked here
    monkeypatch.setattr(report_stage.publish, "one_per_seed", lambda runs: (runs, runs[:1]))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{rp.README_BEGIN}\nold\n{rp.README_END}\n")
    report_stage.run(p, tmp_path / "models", tmp_path / "results", tmp_path / "reports", missing="list", readme=readme)
    assert "capsnet_r1 seed 0: run capsnet_r1-0 was trained again under the same protocol" in capsys.readouterr().out
    text = (tmp_path / "reports" / "ablation.md").read_text()
    assert "capsnet_r1: seeds 1" in text and "old" not in readme.read_text()
    names = {path.name for path in logged["files"]}
    assert {"ablation.md", "claims.csv", "learning_curves.png", "table1_errors.png"} <= names
    assert {"capsnet_r1/error_pct", "affnist_gap_pp/gap", "affnist_gap_pp/ci_low"} <= set(logged["metrics"])


def test_the_terminals_claims_summary_reads_claims_csv_and_flags_a_smoke_run(tmp_path):
    """`capsnet report`'s closing lines: one per claim, under a heading that flags a smoke run; an empty
    claims.csv (no claim to read), or one with its header alone, says nothing."""
    from pipeline.stages import report as report_stage

    (tmp_path / "claims.csv").write_text("")
    assert report_stage.claims_summary(tmp_path, "gpu") == []
    (tmp_path / "claims.csv").write_text("claim,paper,ours,status\n")
    assert report_stage.claims_summary(tmp_path, "gpu") == []
    rows = "routing helps,0.25,0.30,consistent\nrecon,0.3,0.3,open\n"
    (tmp_path / "claims.csv").write_text("claim,paper,ours,status\n" + rows)
    heading, *lines = report_stage.claims_summary(tmp_path, "smoke")
    assert "(SMOKE RUN: tiny data, 1 epoch" in heading and lines == ["  routing helps: consistent", "  recon: open"]
    assert "SMOKE" not in report_stage.claims_summary(tmp_path, "gpu")[0]


def test_report_stage_writes_every_declared_output_whatever_the_variants(tmp_path, monkeypatch):
    """dvc.yaml declares the same report outputs for every variant list: figures with nothing to
    show say so, and the DVC plot data exist."""
    from conftest import REPO
    from pipeline.stages import report as report_stage
    from pipeline.core.params import load_params

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    for seed in (0, 1):  # at a commit whose short hash is all digits: text in the CSVs all the same
        fabricate(tmp_path, "capsnet_r1", seed, 1.0 + seed, recon=False, history=[3.0, 1.0 + seed],
                  commit="1527642c1676c11f37cb2c9166883de9eb153291")
    p = with_ablation(load_params(REPO / "params.yaml"), stacked=(), separate=("capsnet_r1",), seeds=(0, 1))
    for seed in (0, 1):
        edit_record(tmp_path, "capsnet_r1", seed, lambda record: record.update(
            params={"device": "cpu"},
            environment={**record["environment"], "device_name": "cpu", "cuda_version": "None"}))
    (tmp_path / "reports" / "metrics").mkdir(parents=True)
    (tmp_path / "reports" / "metrics" / "capsnet_r3.json").write_text("{}")  # a variant no longer listed
    report_stage.run(p, tmp_path / "models", tmp_path / "results", tmp_path / "reports")
    [variant_metrics] = (tmp_path / "reports" / "metrics").iterdir()
    assert variant_metrics.name == "capsnet_r1.json"
    assert json.loads(variant_metrics.read_text()) == {  # means over the two seeds, the per-run keys
        "error_pct": 1.5, "transformed_error_pct": 50.0, "n_test": 200, "n_transformed": 200, "n_params": 8215568,
        "epochs_trained": 1, "reached_target": False}
    figs = tmp_path / "reports" / "figures"
    for name in ("table1_errors", "table1_effects", "learning_curves", "reconstructions", "fig4", "affnist_bins"):
        assert (figs / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert list(pd.read_csv(tmp_path / "reports" / "claims.csv").columns[:4]) == ["claim", "paper", "ours", "status"]
    curves = pd.read_csv(tmp_path / "reports" / "plots" / "learning_curves.csv")
    assert curves.to_dict("list") == {"variant": ["capsnet_r1"] * 2, "epoch": [1, 2], "test_error_pct": [3.0, 1.5]}
    confusion = pd.read_csv(tmp_path / "reports" / "plots" / "confusion.csv")
    assert list(confusion.columns) == ["actual", "predicted"] and len(confusion) == 200
    from pipeline.core import registry

    block = report_stage.readme_block(tmp_path / "reports", [registry.load(name) for name in registry.names()])
    assert "| paper recipe (1527642) |" in block  # the README block, read back from the CSVs
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    [run] = client.search_runs([client.get_experiment_by_name("capsnet-repro").experiment_id])
    assert run.data.metrics["capsnet_r1/error_pct"] == pytest.approx(1.5)


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


def test_effects_and_verdicts_say_what_would_settle_them(tmp_path):
    """The report's power columns come from each row's own runs: the effect's interval parts and each
    arm's seeds, our spread against the paper's σ; the Claims section leads the report."""
    import numpy as np

    from pipeline.report import power

    from pipeline.report import stats

    for seed, (a, b) in enumerate([(0.5, 1.0), (1.0, 1.5), (1.5, 1.0)]):
        fabricate(tmp_path, "capsnet_r3_recon", seed, a, n=1000)
        fabricate(tmp_path, "capsnet_r3", seed, b, n=1000, recon=False)
    runs = load(tmp_path, ["capsnet_r3_recon", "capsnet_r3"], [0, 1, 2])
    row = t1.effects(runs, REFERENCE).set_index("effect").loc["reconstruction on vs off, routing 3"]
    parts = stats.effect_parts(np.stack([~r.correct["test"] for r in runs[:3]]),
                               np.stack([~r.correct["test"] for r in runs[3:]]))
    assert row.mde == pytest.approx(power.detectable(parts.terms()))
    # nested wrong images (seed 2's include seed 1's): per-image seed noise, which more seeds average away
    assert parts.systematic == 0 and power.power(-0.10, parts.floor()) == pytest.approx(1.0)
    assert row.seeds_needed == power.seeds_phrase(power.effect_seeds_needed(parts, -0.10), -0.10) == "more than 100"
    assert math.isnan(row.gpu_hours)  # no benchmarks given: no estimate, never a guess
    verdict = t1.summarize(runs, REFERENCE).set_index("variant").loc["capsnet_r3_recon"]
    terms = power.paper_terms(0.25, 3, 0.005)  # our seed variance of 0.5, 1.0, 1.5; the paper's σ
    assert verdict.equivalence_margin == pytest.approx(power.equivalence_margin(1.0 - 0.25, terms))
    assert verdict.seeds_to_separate == str(power.seeds_needed(0.75, lambda k: power.paper_terms(0.25, k, 0.005)))
    effect_table = t1.effects(runs, REFERENCE)
    claims = rc.effect_claims(effect_table, effect_table.protocol.iloc[0])
    text = markdown(t1.summarize(runs, REFERENCE), effect_table, profile="gpu", deviations=[],
                              provenance={}, figures={}, reference=REFERENCE, claims=claims)
    assert text.index("## Claims") < text.index("## Table 1") < text.index("#### What would settle each effect")
    assert "| Reconstruction helps (routing 3) | -0.10 pp |" in text and "### What would settle each verdict" in text


def test_the_effects_figure_plots_the_headline_protocols_effects_with_what_would_settle_each(tmp_path, monkeypatch):
    """table1_effects.png: one row per effect of the headline protocol (another protocol's left out),
    our estimate and interval (none where confounded), the paper's effect, and the seeds note; a
    placeholder where the protocol compares no pair."""
    from pipeline.report import figures

    drawn = {}
    monkeypatch.setattr(figures, "effect_intervals", lambda *args: drawn.update(args=args))
    row = {"protocol": "p", "a": "x", "b": "y", "per_seed": "", "status": "", "n_seeds": 3, "equivalence_seeds": "–"}
    table = pd.DataFrame([
        row | {"effect": "routing 3 vs 1, with reconstruction", "paper_delta": -0.04, "our_delta": 0.03,
               "ci_low": -0.15, "ci_high": 0.22, "seeds_needed": "84"},
        row | {"effect": "CapsNet r3 + recon vs baseline", "paper_delta": -0.14, "our_delta": -0.11,
               "ci_low": -0.29, "ci_high": 0.06, "seeds_needed": "none suffices (the test set's own noise hides it)"},
        row | {"effect": "official vs paper recipe, routing 3, with reconstruction", "paper_delta": math.nan,
               "our_delta": -0.04, "ci_low": math.nan, "ci_high": math.nan, "seeds_needed": "–"},
        row | {"protocol": "q", "effect": "routing 3 vs 1, with reconstruction", "paper_delta": -0.04, "our_delta": 9.0,
               "ci_low": 8.0, "ci_high": 10.0, "seeds_needed": "3"}])
    assert t1_figures.effects_figure(table, "p", tmp_path) == {"Ablation effects (p)": "figures/table1_effects.png"}
    effects, ours, intervals, paper, notes, path = drawn["args"]
    assert effects == list(table.effect[:3]) and ours == [0.03, -0.11, -0.04] and path == tmp_path / "table1_effects.png"
    assert intervals[:2] == [(-0.15, 0.22), (-0.29, 0.06)] and all(math.isnan(v) for v in intervals[2])
    assert paper[:2] == [-0.04, -0.14] and math.isnan(paper[2])
    assert notes == ["84 seeds/arm to detect the paper's", "no seed count detects the paper's", "confounded: no interval"]
    assert t1_figures.effects_figure(table, "other", tmp_path) == {}
    assert (tmp_path / "table1_effects.png").read_bytes()[:4] == b"\x89PNG"  # the placeholder


def test_the_error_figure_and_curves_tell_a_variants_commits_apart_and_one_seed_has_no_interval(tmp_path, monkeypatch):
    """table1_errors.png labels each row of a variant trained at two commits with its commit, gives each
    row its own seeds, and draws our mean's interval where a row has seeds to spread (t over their std);
    learning_curves.csv has one line per row, named with its commit; a recipe effect with an interval
    notes the seeds that would see Table 1's smallest effect in table1_effects.png."""
    from pipeline.report import figures

    drawn = {}
    monkeypatch.setattr(figures, "seed_errors", lambda *args: drawn.update(errors=args))
    monkeypatch.setattr(figures, "effect_intervals", lambda *args: drawn.update(effects=args))
    for seed, err, commit in ((0, 1.0, COMMIT), (1, 2.0, COMMIT), (2, 0.5, "abcdef0" + "1" * 33)):
        fabricate(tmp_path, "capsnet_r3", seed, err, recon=False, commit=commit)
    runs = load(tmp_path, ["capsnet_r3"], [0, 1, 2])
    summary = t1.summarize(runs, REFERENCE)
    (tmp_path / "figures").mkdir()
    t1_figures.figures_of(runs, summary, tmp_path / "results", tmp_path / "figures")
    labels, per_seed, intervals, *_ = drawn["errors"]
    assert labels == ["capsnet_r3 (c0ffee0)", "capsnet_r3 (abcdef0)"] and per_seed == [[1.0, 2.0], [0.5]]
    half = sp.t.ppf(0.975, 1) * 0.5  # s = √0.5 over 2 seeds: SE 0.5, 1 degree of freedom
    assert intervals[0] == pytest.approx((1.5 - half, 1.5 + half)) and all(math.isnan(v) for v in intervals[1])
    t1_figures.dvc_plot_data(runs, summary, tmp_path / "results", tmp_path)
    curves = pd.read_csv(tmp_path / "learning_curves.csv")
    assert list(curves.variant) == ["capsnet_r3 (1 ep, c0ffee0)", "capsnet_r3 (1 ep, abcdef0)"]
    assert list(curves.test_error_pct) == [1.5, 0.5]
    recipe = {"protocol": "p", "effect": "official vs paper recipe, routing 3, no reconstruction",
              "paper_delta": math.nan, "our_delta": 0.01, "ci_low": -0.05, "ci_high": 0.07, "seeds_needed": "–",
              "equivalence_seeds": "30"}
    t1_figures.effects_figure(pd.DataFrame([recipe]), "p", tmp_path)
    assert drawn["effects"][4] == ["±0.04 pp: 30 seeds/arm"]


def test_the_figures_and_plot_data_read_the_headline_protocol_and_its_best_rows_best_run(tmp_path, monkeypatch):
    """table1_errors.png draws the headline protocol's rows alone, titled with it: each row its own seeds,
    our mean's interval, the paper's mean and σ; reconstructions.png and fig4.png are the lowest-error
    reconstruction row's own lowest-error run's two figures, named with its seed; learning_curves.csv and
    confusion.csv read the headline protocol alone, the confusion (actual, predicted) from its
    lowest-error row's best run."""
    from pipeline.report import figures

    other = "abcdef0" + "1" * 33
    head, short = tmp_path / "head", tmp_path / "short"  # the headline protocol has more runs
    for variant, seed, err, commit in (("capsnet_r3_recon", 0, 0.3, COMMIT), ("capsnet_r3_recon", 1, 0.4, COMMIT),
                                       ("capsnet_r3_recon", 2, 0.8, COMMIT), ("capsnet_r3_recon", 3, 0.1, other),
                                       ("capsnet_r3_recon", 4, 1.5, other), ("capsnet_r1_recon", 0, 0.6, COMMIT),
                                       ("capsnet_r1_recon", 1, 0.7, COMMIT), ("capsnet_r1_recon", 2, 0.8, COMMIT)):
        fabricate(head, variant, seed, err, n=1000, commit=commit)
        for name in ("reconstructions.png", "fig4.png"):
            path = rr.run_figure(head / "results" / variant / f"seed{seed}", name)
            path.parent.mkdir(exist_ok=True)
            path.write_text(f"{variant} seed {seed} {name}")
    for seed, err in ((0, 0.9), (1, 0.2)):  # the same variant and commit under a compressed schedule
        fabricate(short, "capsnet_r3_recon", seed, err, n=1000, lr_schedule_epochs=640)
    runs = (load(head, ["capsnet_r3_recon"], range(5)) + load(head, ["capsnet_r1_recon"], range(3))
            + load(short, ["capsnet_r3_recon"], [0, 1]))
    summary = t1.summarize(runs, REFERENCE)
    headline = runs[0].protocol
    assert summary.protocol.iloc[0] == headline != runs[-1].protocol
    drawn = {}
    monkeypatch.setattr(figures, "seed_errors", lambda *args: drawn.update(errors=args))
    (tmp_path / "figures").mkdir()
    shown = t1_figures.figures_of(runs, summary, head / "results", tmp_path / "figures")
    labels, per_seed, intervals, paper, paper_std, _ = drawn["errors"]
    rows = dict(zip(labels, zip(per_seed, intervals)))
    assert sorted(rows) == ["capsnet_r1_recon", "capsnet_r3_recon (abcdef0)", "capsnet_r3_recon (c0ffee0)"]
    assert rows["capsnet_r3_recon (c0ffee0)"][0] == [0.3, 0.4, 0.8]
    assert rows["capsnet_r3_recon (abcdef0)"][0] == [0.1, 1.5]
    assert sum(rows["capsnet_r3_recon (c0ffee0)"][1]) / 2 == pytest.approx(0.5)  # the mean's, not the median's
    table = REFERENCE["table1"]
    assert paper == [table[v.split()[0]]["test_error_pct"] for v in labels]
    assert paper_std == [table[v.split()[0]]["test_error_std"] for v in labels]
    assert shown == {f"Test error per variant ({headline})": "figures/table1_errors.png",
                     "Reconstructions (capsnet_r3_recon, seed 0)": "figures/reconstructions.png",
                     "Fig. 4 perturbations (capsnet_r3_recon, seed 0)": "figures/fig4.png"}
    for name in ("reconstructions.png", "fig4.png"):
        assert (tmp_path / "figures" / name).read_text() == f"capsnet_r3_recon seed 0 {name}"
    t1_figures.dvc_plot_data(runs, summary, head / "results", tmp_path)
    curves = (tmp_path / "learning_curves.csv").read_text().splitlines()
    assert sorted(curves[1:]) == ['"capsnet_r3_recon (1 ep, abcdef0)",1,0.8000',  # a label with a comma, quoted
                                  '"capsnet_r3_recon (1 ep, c0ffee0)",1,0.5000', "capsnet_r1_recon,1,0.7000"]
    confusion = pd.read_csv(tmp_path / "confusion.csv")
    # 3 of 1,000 wrong: seed 0 (0.3 %), the best row's best run; every other run has another count
    assert (confusion.actual == 0).all() and list(confusion.predicted.value_counts().sort_index()) == [997, 3]


def test_each_protocol_has_its_own_learning_curve_panel(tmp_path, monkeypatch):
    """A cut and a compressed schedule never share a panel, as they never share a table (headline protocol
    first); a variant trained by two codes under one protocol is two lines there, told apart by their
    fingerprints; one trained by one code is its bare name; each schedule's learning rate is drawn."""
    from pipeline.stages import report as report_stage

    for seed in (0, 1):
        for variant in ("capsnet_r1", "capsnet_r3"):
            fabricate(tmp_path / "cut", variant, seed, 1.0, recon=False, history=[3.0, 1.0])
        fabricate(tmp_path / "compressed", "capsnet_r1", seed, 1.0, recon=False, history=[3.0, 1.5],
                  lr_schedule_epochs=640, fingerprint="ab" * 8 if seed else "cd" * 8)
    cut = load(tmp_path / "cut", ["capsnet_r1", "capsnet_r3"], [0, 1])
    compressed = load(tmp_path / "compressed", ["capsnet_r1"], [0, 1])
    drawn = {}
    monkeypatch.setattr(report_stage.figures, "learning_curve_panels",
                        lambda panels, lr, path: drawn.update(panels=panels, lr=lr))
    report_stage.learning_curves([("MNIST", compressed + cut), ("canvas", [])], tmp_path / "curves.png")
    assert list(drawn["panels"]) == [f"MNIST\n{cut[0].protocol}", f"MNIST\n{compressed[0].protocol}"]
    first, second = drawn["panels"].values()
    assert first == {"capsnet_r1": [([1, 2], [3.0, 1.0])] * 2, "capsnet_r3": [([1, 2], [3.0, 1.0])] * 2}
    assert second == {"capsnet_r1 (2 ep, fp cdcdcdcd)": [([1, 2], [3.0, 1.5])],
                      "capsnet_r1 (2 ep, fp abababab)": [([1, 2], [3.0, 1.5])]}
    assert list(drawn["lr"]) == [cut[0].schedule, compressed[0].schedule]
    monkeypatch.undo()
    report_stage.learning_curves([("MNIST", compressed + cut)], tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_table1s_section_leaves_its_summary_for_multimnist_and_writes_its_outputs_with_or_without_runs(tmp_path):
    """Table 1's section, called as the report stage calls it: with runs, its summary is left in
    ``ctx.shared`` (MultiMNIST's column stands beside it), the montage prepare drew is among its figures,
    and its deviations are the Table 1 ones; without a run, its figures are placeholders, its plot data
    and CSVs exist but hold no row, and the deviations are there all the same."""
    from conftest import REPO
    from pipeline.core.params import load_params
    from pipeline.experiments import table1

    params = load_params(REPO / "params.yaml")
    for seed, err in enumerate([0.3, 0.4]):
        fabricate(tmp_path, "capsnet_r3", seed, err, recon=False)
    runs = load(tmp_path, ["capsnet_r3"], [0, 1])
    expected_deviations = t1.deviations(params, REFERENCE)
    assert expected_deviations

    ctx = rp.Context(params, REFERENCE, [], tmp_path / "results", tmp_path / "with")
    ctx.fig_dir.mkdir(parents=True)
    (ctx.fig_dir / table1.MONTAGE).write_bytes(b"\x89PNG")
    section = table1.report(runs, ctx)
    pd.testing.assert_frame_equal(ctx.shared["table1"], t1.summarize(runs, REFERENCE, []))
    assert section.figures["Affine-shifted test set"] == "figures/affine_montage.png"
    assert section.deviations == expected_deviations and section.tables["results.csv"].count("\n") == 2

    empty = rp.Context(params, REFERENCE, [], tmp_path / "results", tmp_path / "without")
    empty.fig_dir.mkdir(parents=True)
    section = table1.report([], empty)
    assert "table1" not in empty.shared and section.deviations == expected_deviations
    assert section.tables == {"results.csv": "", "effects.csv": ""} and not section.lines
    for name in ("table1_errors", "table1_effects", "reconstructions", "fig4"):
        assert (empty.fig_dir / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert (empty.out / "plots" / "learning_curves.csv").read_text() == "variant,epoch,test_error_pct\n"
    assert (empty.out / "plots" / "confusion.csv").read_text() == "actual,predicted\n"
    for name, text in section.tables.items():
        (empty.out / name).write_text(text)
    assert table1.readme(empty.out) == []  # no README lines from CSVs without a row


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


def test_runs_that_record_no_commit_share_no_commit(tmp_path):
    """Two variants' rows whose runs record no commit (neither config.json nor a journal names one) are of
    unknown training code: "not recorded" is no commit they share, so their effect is confounded; in the
    report's cohorts of rows by shared commit, such a row is a group of its own, not left out."""
    from pipeline.report.rows import cohorts, commits_of, shared_commit

    for seed in (0, 1, 2):
        fabricate(tmp_path, "capsnet_r1", seed, 1.0 + seed / 10, n=1000, commit=None)
        fabricate(tmp_path, "capsnet_r3", seed, 0.9 + seed / 10, n=1000, commit=None)
    runs = load(tmp_path, ["capsnet_r1", "capsnet_r3"], [0, 1, 2])
    r1, r3 = runs[:3], runs[3:]
    assert {r.commit for r in runs} == {protocol.NOT_RECORDED} and commits_of(r1) == []
    assert shared_commit(r1, r3) is None
    effect = routing_effect(runs, [])
    assert math.isnan(effect.ci_low) and effect.status.endswith("no commit in common")
    assert cohorts({"a": ["c1"], "b": ["c2", "c1"], "c": ["c2"], "old": []}) == [  # such a row: a group of its own
        ("c1", ["a", "b"]), ("c2", ["c"]), ("old", ["old"])]


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


def test_the_readme_shows_every_protocols_table1_apart_with_seed_counts_and_the_papers_values(tmp_path):
    """The README block gives the first protocol's Table 1 and effects, then each other protocol's Table 1
    under its own heading (never pooled): a row short of the most seeds says how many it has, two
    fingerprints of one variant at one commit are both shown, and the paper's line is whole though a
    protocol lacks a variant."""
    for seed in range(3):  # the cut schedule: 6 runs
        fabricate(tmp_path / "cut", "capsnet_r1", seed, 1.0 + seed / 10, history=[2.0, 1.0 + seed / 10], recon=False)
        fabricate(tmp_path / "cut", "capsnet_r3", seed, 0.5 + seed / 10, history=[2.0, 0.5 + seed / 10], recon=False)
    for seed in range(2):  # compressed: capsnet_r1 two seeds, capsnet_r3_recon one seed under each of two codes
        fabricate(tmp_path / "compressed", "capsnet_r1", seed, 0.8 + seed / 10, history=[2.0, 0.8 + seed / 10],
                  lr_schedule_epochs=640, fingerprint="1111aaaa1111aaaa", recon=False)
    for seed, fingerprint in ((0, "2222bbbb2222bbbb"), (1, "3333cccc3333cccc")):
        fabricate(tmp_path / "compressed", "capsnet_r3_recon", seed, 0.3 + seed / 10, history=[2.0, 0.3 + seed / 10],
                  lr_schedule_epochs=640, fingerprint=fingerprint)
    runs = (load(tmp_path / "cut", ["capsnet_r1", "capsnet_r3"], [0, 1, 2])
            + load(tmp_path / "compressed", ["capsnet_r1", "capsnet_r3_recon"], [0, 1]))
    summary, effect_table = t1.summarize(runs, REFERENCE), t1.effects(runs, REFERENCE)
    summary.to_csv(tmp_path / "results.csv", index=False)  # read back as the README's block reads it
    effect_table.to_csv(tmp_path / "effects.csv", index=False)
    lines = t1.readme_lines(pd.read_csv(tmp_path / "results.csv"), pd.read_csv(tmp_path / "effects.csv"))
    text = "\n".join(lines)
    cut, compressed = text.index("0.96^(step/2000) ≥"), text.index("0.96^(step/2000 · 640/2) ≥")
    assert cut < text.index("- routing 3 vs 1, no reconstruction: -0.50") < compressed  # the first protocol's effects
    first, second = text[:compressed].splitlines(), text[text.rindex("\n", 0, compressed) + 1:].splitlines()
    assert second[0].startswith("Protocol: **gpu profile: 2 epochs") and ", 4 runs, never pooled" in second[0]
    paper_line = "| paper (Table 1) | – | 0.34 | – | 0.35 | 0.25 |"  # r3 + recon's 0.25 where the cut one lacks it
    assert paper_line in first and paper_line in second  # and r3's 0.35 where the compressed one does
    [cut_row] = [line for line in first if line.startswith("| paper recipe")]
    assert cut_row == "| paper recipe (c0ffee0) | – | 1.10 ± 0.10: not reproduced | – | 0.60 ± 0.10: not reproduced | – |"
    [compressed_row] = [line for line in second if line.startswith("| paper recipe")]
    assert compressed_row == ("| paper recipe (c0ffee0) | – | 0.85 ± 0.07 (2 seeds): not reproduced | – | – | "
                              "0.30 ± –: one seed: no verdict; 0.40 ± –: one seed: no verdict |")  # both fingerprints
