"""Table 1's section on fabricated per-seed evaluation files: the verdict of each row, the effects
and their seed-aware intervals, the precision check, the claims and what would settle them, and the
README's block. Its deviations: tests/test_report_deviations.py; which runs make a row:
tests/test_report_pooling.py; §5.2's section: tests/test_report_affnist.py; the run records:
tests/test_report_runs.py; the report stage and its figures' data: tests/test_report_stage.py;
MultiMNIST's column: tests/test_multimnist.py."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sp

from conftest import with_ablation
from report_runs import COMMIT, REFERENCE, fabricate, load, markdown
from pipeline.experiments import table1_readme as t1_readme
from pipeline.experiments import table1_report as t1
from pipeline.report import claims as rc
from pipeline.report import document as rp
from pipeline.report import runs as rr


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
    assert "Precision check: bf16 − fp32 = +0.00 pp" in "\n".join(t1_readme.readme_lines(summary, table))
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
    lines = t1_readme.readme_lines(pd.read_csv(tmp_path / "results.csv"), pd.read_csv(tmp_path / "effects.csv"))
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
