"""The GPU time that would settle a claim (pipeline.report.costs, claims.run_cost and the settling plans):
taken from each variant's own measured speed in reports/benchmarks.md, on the device its runs trained
on, or a stand-in's row that says so; the paper protocol's hours; and why, where it cannot be priced."""

import math

import numpy as np
import pandas as pd
import pytest
from claim_rows import effect_row

from pipeline.report import claims as rc
from pipeline.report import costs
from pipeline.report import power
from pipeline.report import stats


BENCH = """# Benchmarks
## CPU (2 cores)
### capsnet_r3_recon
| configuration | train images/s |
|---|---|
| capsnet-repro eager fp32 | 105.2 |
## GPU: one NVIDIA H100 80GB HBM3 (device tool, 2026-11-22)
### capsnet_r3_recon (1.20 GFLOP per training image)
| configuration | train images/s | ms/step |
|---|---|---|
| reference (eager fp32, DataLoader) | 6,245 | 20.50 |
| capsnet-repro eager fp32 | 21,096 | 6.07 |
| capsnet-repro bf16 + compile (model+loss) | 24,000 | 5.25 |
### baseline_cnn (11.78 GFLOP per training image)
| configuration | train images/s | ms/step |
|---|---|---|
| capsnet-repro bf16 + compile (model+loss) | 12,000 | 4.62 |
"""


def bench_rows(tmp_path, text: str = BENCH) -> list:
    """costs.bench_rows of a benchmarks file holding ``text``."""
    (tmp_path / "benchmarks.md").write_text(text)
    return costs.bench_rows(tmp_path / "benchmarks.md")


class FakeRun:
    def __init__(self, variant, images=6_000_000, amp=True, compiled=True, device="NVIDIA H100 80GB HBM3", epochs=50,
                 stop_reason="epochs"):
        self.variant, self.images_trained, self.epochs_trained = variant, images, epochs
        self.cfg = {"amp": amp, "compile": compiled}
        self.config = {"environment": {"device_name": device}, "stop_reason": stop_reason}


def test_costs_come_from_each_variants_own_row_on_its_device(tmp_path):
    rows = bench_rows(tmp_path)
    assert [(r.variant, r.images_per_s) for r in rows] == [
        ("capsnet_r3_recon", 21_096.0), ("capsnet_r3_recon", 24_000.0), ("baseline_cnn", 12_000.0)]  # GPU rows only
    hours, source = rc.run_cost([FakeRun("baseline_cnn")], 10, rows)
    assert hours == pytest.approx(10 * 6e6 / 12_000 / 3600) and "baseline_cnn" in source and "12,000" in source
    hours, _ = rc.run_cost([FakeRun("capsnet_r3_recon", amp=False, compiled=False)], 10, rows)
    assert hours == pytest.approx(10 * 6e6 / 21_096 / 3600)  # the configuration it trained in
    both, source = rc.pair_cost([FakeRun("capsnet_r3_recon")], [FakeRun("baseline_cnn")], 4, rows)
    assert both == pytest.approx(4 * 6e6 / 24_000 / 3600 + 4 * 6e6 / 12_000 / 3600)
    assert "24,000" in source and "12,000" in source
    hours, why = rc.run_cost([FakeRun("capsnet_r3_recon_official")], 10, rows)  # never another variant's speed
    assert math.isnan(hours) and "no bench row for capsnet_r3_recon_official" in why
    hours, why = rc.run_cost([FakeRun("baseline_cnn", device="NVIDIA A100")], 10, rows)
    assert math.isnan(hours) and "NVIDIA A100" in why


def test_a_runs_speed_settings_name_its_bench_row_and_only_well_formed_gpu_rows_are_read(tmp_path):
    """A compile mode, channels-last or capture names its lever's row (scripts/bench_table.py's labels);
    plain settings the two-word configurations. A missing benchmarks file, a row that is not a speed
    and a table before its section's first variant heading give no row."""
    assert costs.configuration({"amp": True, "compile": True}) == "bf16 + compile"
    compiled = {"amp": True, "compile": True}
    assert costs.configuration(compiled | {"compile_mode": "max-autotune-no-cudagraphs"}) == "bf16-autotune"
    assert costs.configuration(compiled | {"compile_mode": "reduce-overhead"}) == "bf16-graphs"
    assert costs.configuration({"amp": True, "compile": False, "channels_last": True}) == "bf16-cl"
    assert costs.configuration({"amp": False, "compile": True, "cuda_graph": True}) == "compile-capture"
    assert costs.configuration({"amp": True}) == "bf16 autocast"  # no compile recorded: off, as the published rows say
    assert costs.configuration({}) == "eager fp32"
    assert costs.bench_rows(tmp_path / "absent.md") == []
    rows = bench_rows(tmp_path, BENCH + "| capsnet-repro bf16-capture | failed: out of memory |\n"
                                "## GPU: one NVIDIA H200 (device tool, 2026-11-28)\n"
                                "| capsnet-repro eager fp32 | 30,000 |\n"
                                "## CPU: one AMD EPYC host (2 cores)\n### baseline_cnn\n"  # a CPU never prices GPU time
                                "| capsnet-repro eager fp32 | 900 |\n")
    assert [(r.variant, r.images_per_s) for r in rows] == [
        ("capsnet_r3_recon", 21_096.0), ("capsnet_r3_recon", 24_000.0), ("baseline_cnn", 12_000.0)]
    h100 = "NVIDIA H100 80GB HBM3"
    # starts with "compile", and below the plain row: the newest row is read first (`costs.speed`)
    captured = "compile-capture: fp32, compile default, the whole step as one CUDA graph"
    levers = [costs.BenchRow("baseline_cnn", h100, f"capsnet-repro {name}", speed, "GPU: one H100")
              for name, speed in (("compile (model+loss)", 20_000.0), (captured, 50_000.0))]
    assert costs.speed(levers, "baseline_cnn", h100, {"amp": False, "compile": True}).images_per_s == 20_000.0


def test_a_later_section_of_a_device_prices_over_an_earlier_one_and_cites_it(tmp_path):
    """A window's section is appended below the earlier ones (scripts/bench_table.py … >> benchmarks.md): where
    two sections time one device, a run is priced at the later (newest) row, and the citation names its section.
    A configuration only the earlier section timed is still priced from it."""
    later = ("## GPU: one NVIDIA H100 80GB HBM3 (device tool, 2026-12-01)\n### baseline_cnn (11.78 GFLOP)\n"
             "| capsnet-repro bf16 + compile (model+loss) | 15,000 | 3.70 |\n")
    rows = bench_rows(tmp_path, BENCH + later)
    hours, source = rc.run_cost([FakeRun("baseline_cnn")], 10, rows)
    assert hours == pytest.approx(10 * 6e6 / 15_000 / 3600)
    assert source == ("GPU: one NVIDIA H100 80GB HBM3 (device tool, 2026-12-01) | "
                      "baseline_cnn bf16 + compile (model+loss): 15,000 images/s")  # BenchRow.cite
    assert costs.speed(rows, "capsnet_r3_recon", "NVIDIA H100 80GB HBM3", {}).images_per_s == 21_096.0


def test_cited_rows_read_as_one_sentence_per_section_each_row_once():
    cites = ["S1 | a bf16: 1 images/s", "S2 | b fp32: 2 images/s", "S1 | c bf16: 3 images/s", "S1 | a bf16: 1 images/s"]
    assert costs.sources(cites) == ("reports/benchmarks.md, S1: a bf16: 1 images/s, c bf16: 3 images/s. "
                                    "reports/benchmarks.md, S2: b fp32: 2 images/s.")


def test_a_stand_in_is_the_lightest_variant_on_the_device_that_does_the_work_and_lends_only_its_own_rows():
    """Per device: capsnet_r1 takes capsnet_r3's rows over capsnet_r3_recon's (as much routing, no decoder)
    where both are benched, nothing where neither is, and never another variant's row (the CNN's); a benched
    variant the params no longer name is passed over. The decoder alone reads as just that."""
    net = costs.Network
    networks = {"capsnet_r1": net("capsnet", "table1", 1, False), "capsnet_r3": net("capsnet", "table1", 3, False),
                "capsnet_r3_recon": net("capsnet", "table1", 3, True),
                "baseline_cnn": net("baseline_cnn", "table1", 0, False)}
    assert networks["capsnet_r3"].relation(networks["capsnet_r3_recon"]) == "an upper bound: the decoder too"

    def row(variant, device, speed):
        return costs.BenchRow(variant, device, "capsnet-repro eager fp32", speed, f"GPU: one {device}")

    rows = [row("capsnet_r3_recon", "H100", 10.0), row("capsnet_r3", "H100", 20.0), row("baseline_cnn", "H100", 30.0),
            row("capsnet_r9_retired", "H100", 40.0), row("capsnet_r3_recon", "H200", 50.0)]
    stood = [(r.variant, r.device, r.stand_in, r.images_per_s)
             for r in costs.with_stand_ins(rows, networks) if r.stand_in]
    assert stood == [("capsnet_r1", "H100", "capsnet_r3", 20.0),
                     ("capsnet_r1", "H200", "capsnet_r3_recon", 50.0), ("capsnet_r3", "H200", "capsnet_r3_recon", 50.0)]


def test_a_variant_never_benched_takes_the_row_of_one_with_its_layers_or_more_and_says_so(tmp_path):
    """costs.with_stand_ins: on a device where a variant has no row, a recipe twin takes its paper
    recipe's row (the same layers), a lighter CapsNet the row of the closest one that does more work on
    them (an upper bound), a CNN never a CapsNet's, a CapsNet never a lighter one's; the citation names it."""
    net = costs.Network
    networks = {"capsnet_r1": net("capsnet", "table1", 1, False), "capsnet_r1_recon": net("capsnet", "table1", 1, True),
                "capsnet_r3_recon": net("capsnet", "table1", 3, True), "capsnet_r3_recon_official": net("capsnet", "table1", 3, True),
                "baseline_cnn": net("baseline_cnn", "table1", 0, False), "cnn_affnist": net("pooling_cnn", "affnist", 0, False),
                "capsnet_affnist": net("capsnet", "affnist", 3, True)}
    rows = bench_rows(tmp_path)
    stood = {r.variant: r for r in costs.with_stand_ins(rows, networks) if r.stand_in and r.images_per_s == 24_000.0}
    assert sorted(stood) == ["capsnet_r1", "capsnet_r1_recon", "capsnet_r3_recon_official"]  # not the CNNs, not §5.2's
    assert stood["capsnet_r3_recon_official"].relation == "the same layers"
    assert stood["capsnet_r1_recon"].relation == "an upper bound: 3 routing iterations, not 1"
    assert stood["capsnet_r1"].relation == "an upper bound: 3 routing iterations, not 1, the decoder too"
    hours, source = rc.run_cost([FakeRun("capsnet_r3_recon_official")], 10, costs.with_stand_ins(rows, networks))
    assert hours == pytest.approx(10 * 6e6 / 24_000 / 3600)
    assert "capsnet_r3_recon_official at capsnet_r3_recon's bf16 + compile (model+loss) (the same layers): 24,000" in source
    benched_r1_recon = [*rows, costs.BenchRow("capsnet_r1_recon", "NVIDIA H100 80GB HBM3",
                                              "capsnet-repro bf16 + compile (model+loss)", 30_000.0, "GPU: one H100")]
    closest = {r.variant: r.stand_in for r in costs.with_stand_ins(benched_r1_recon, networks) if r.stand_in}
    assert closest["capsnet_r1"] == "capsnet_r1_recon"  # the closest that does at least its work
    assert "capsnet_r3_recon" not in closest  # its own row; and r1_recon's, lighter, would never stand in for it
    only_light = [r for r in benched_r1_recon if r.variant == "capsnet_r1_recon"]
    assert {r.variant for r in costs.with_stand_ins(only_light, networks) if r.stand_in} == {"capsnet_r1"}


def test_the_paper_protocols_cost_is_the_same_seeds_for_640_epochs_of_the_runs_images(tmp_path):
    """What settling a claim would take under the authors' protocol: each arm's images per epoch (as its
    runs recorded them) for 640 epochs at its own speed; nothing for arms that trained 640 epochs
    already (the first estimate is that) or trained to a target accuracy (no number of epochs)."""
    rows = bench_rows(tmp_path)
    short = [FakeRun("baseline_cnn", images=3_000_000, epochs=50), FakeRun("baseline_cnn", images=3_000_000, epochs=50)]
    hours, source = rc.run_cost(short, 10, rows, epochs=640)
    assert hours == pytest.approx(10 * 60_000 * 640 / 12_000 / 3600) and "12,000" in source
    caps = [FakeRun("capsnet_r3_recon", images=1_200_000, epochs=20)]
    assert rc.paper_protocol_cost(caps, short, 4, rows) == pytest.approx(
        4 * 60_000 * 640 / 24_000 / 3600 + 4 * 60_000 * 640 / 12_000 / 3600)
    assert math.isnan(rc.paper_protocol_cost([FakeRun("baseline_cnn", epochs=640)],
                                             [FakeRun("capsnet_r3_recon", epochs=640)], 4, rows))
    hours, why = rc.run_cost([FakeRun("baseline_cnn", stop_reason="target")], 10, rows, epochs=640)
    assert math.isnan(hours) and "target accuracy" in why
    assert rc.run_cost([FakeRun("baseline_cnn", stop_reason="target")], 10, rows)[0] == pytest.approx(
        10 * 6e6 / 12_000 / 3600)  # its own protocol's cost stays


def test_a_cost_that_cannot_be_estimated_says_which_arm_and_why(tmp_path):
    """No recorded training length, no bench row for the run's configuration (named), either arm alone
    or both: the pair's GPU time is NaN and says why for each arm that has none, and only those."""
    rows = bench_rows(tmp_path)
    hours, why = rc.run_cost([FakeRun("baseline_cnn", images=0)], 10, rows)
    assert math.isnan(hours) and why == "baseline_cnn: training length not recorded"
    hours, why = rc.run_cost([FakeRun("baseline_cnn", amp=False)], 10, rows)
    assert math.isnan(hours)
    assert why == "no bench row for baseline_cnn (compile) on NVIDIA H100 80GB HBM3 in reports/benchmarks.md"
    unpriced, priced = FakeRun("baseline_cnn", images=0), FakeRun("capsnet_r3_recon")
    hours, why = rc.pair_cost([priced], [unpriced], 4, rows)
    assert math.isnan(hours) and why == "baseline_cnn: training length not recorded"
    hours, why = rc.pair_cost([FakeRun("capsnet_r1")], [unpriced], 4, rows)
    assert math.isnan(hours) and why.startswith("no bench row for capsnet_r1 (")
    assert why.endswith("in reports/benchmarks.md; baseline_cnn: training length not recorded")


def test_a_rows_verdict_plans_from_its_seeds_spread_and_prices_the_seeds_it_needs_at_its_runs_mean_length(tmp_path):
    """verdict_settling (ours − the paper's value): the margin and the seeds to separate from the seeds'
    sample variance (n − 1), priced at the mean training length of the row's runs; no plan from one seed,
    without a paper value, or where ours equals the paper's (nothing to separate, nothing priced)."""
    rows = bench_rows(tmp_path)
    runs = [FakeRun("capsnet_r3_recon", images=3_000_000), FakeRun("capsnet_r3_recon", images=6_000_000)]
    errors, paper, sigma = [0.30, 0.35, 0.42], 0.25, None  # no paper σ: our seeds' spread alone
    out = rc.verdict_settling(runs, errors, paper, sigma, rows)
    var, delta = 0.0036333, 0.3566667 - paper  # by hand: mean 0.35667, squares 0.00321 + 0.00004 + 0.00401 over 2
    assert float(np.var(errors, ddof=1)) == pytest.approx(var, rel=1e-4)
    assert out["equivalence_margin"] == pytest.approx(power.equivalence_margin(delta, power.paper_terms(var, 3, sigma)),
                                                      rel=1e-4)
    needed = power.seeds_needed(delta, lambda k: power.paper_terms(var, k, sigma))
    assert out["seeds_to_separate"] == str(needed) and needed > 2
    assert out["gpu_hours_to_separate"] == pytest.approx(needed * 4.5e6 / 24_000 / 3600)
    assert out["cost_source"].endswith("capsnet_r3_recon bf16 + compile (model+loss): 24,000 images/s")
    for errors_, paper_ in (([0.30], paper), (errors, math.nan), ([0.25, 0.25, 0.25], 0.25)):
        out = rc.verdict_settling(runs, errors_, paper_, sigma, rows)
        assert set(out) == {"equivalence_margin", "seeds_to_separate", "gpu_hours_to_separate", "cost_source"}
        assert (out["seeds_to_separate"], out["cost_source"]) == ("–", "")
        assert math.isnan(out["gpu_hours_to_separate"])
        assert math.isnan(out["equivalence_margin"]) == (errors_ != [0.25, 0.25, 0.25])  # ours = paper's: margin 0


def test_a_runs_cost_names_its_device_or_says_it_has_none_and_each_run_of_an_arm_counts(tmp_path):
    """run_cost: a run without a recorded device says 'its device'; any run of the arm that trained to a
    target has no paper-length cost; images per epoch average the runs that recorded both; a pair's two
    citations are joined by '; ', which the Claims section splits into one sentence per section."""
    rows = bench_rows(tmp_path)
    hours, why = rc.run_cost([FakeRun("baseline_cnn", device="")], 10, rows)
    assert math.isnan(hours)
    assert why == "no bench row for baseline_cnn (bf16 + compile) on its device in reports/benchmarks.md"
    assert math.isnan(rc.run_cost([FakeRun("baseline_cnn"), FakeRun("baseline_cnn", stop_reason="target")], 10, rows,
                                  epochs=640)[0])
    counted = [FakeRun("baseline_cnn", images=3_000_000, epochs=50),
               FakeRun("baseline_cnn", images=9_000_000, epochs=0)]  # its epochs not recorded: left out
    assert rc.run_cost(counted, 10, rows, epochs=640)[0] == pytest.approx(10 * 60_000 * 640 / 12_000 / 3600)
    hours, source = rc.pair_cost([FakeRun("capsnet_r3_recon")], [FakeRun("baseline_cnn")], 4, rows)
    assert source == f"{rows[1].cite()}; {rows[2].cite()}"
    claim = effect_row("CapsNet r3 + recon vs baseline", -0.14, -0.29, 0.06, seeds="10", hours=hours, cost_source=source)
    cited = [line for line in rc.render_claims(rc.effect_claims(pd.DataFrame([claim]), "p"), "p")
             if line.startswith("GPU time from")]
    assert cited == ["GPU time from reports/benchmarks.md, GPU: one NVIDIA H100 80GB HBM3 (device tool, 2026-11-22): "
                     "capsnet_r3_recon bf16 + compile (model+loss): 24,000 images/s, "
                     "baseline_cnn bf16 + compile (model+loss): 12,000 images/s."]


def test_an_effect_plans_only_with_two_seeds_a_side_and_more_than_the_budget_is_not_none_suffices():
    """effect_settling and equivalence_settling plan nothing while an arm has one seed; the equivalence
    plan detects EQUIVALENCE_PP, not the estimate; an effect that more than MAX_SEEDS would detect, but
    unlimited seeds would (the test set's floor is low), needs "more than 100", not "none suffices"."""
    one_a_side = stats.EffectParts(0.2, 0.01, 1, 0.01, 3, 0.0004, 10_000)
    effect = rc.effect_settling(one_a_side, 0.05, [], [], [])
    equivalence = rc.equivalence_settling(one_a_side, [], [], [])
    assert math.isnan(effect["mde"]) and effect["seeds_needed"] == "–"
    assert math.isnan(equivalence["equivalence_margin"]) and equivalence["equivalence_seeds"] == "–"
    parts = stats.EffectParts(0.2, 0.004, 3, 0.004, 3, 0.00004, 10_000)
    needed = power.effect_seeds_needed(parts, rc.EQUIVALENCE_PP)
    assert needed != power.effect_seeds_needed(parts, parts.estimate)
    arm = [FakeRun("capsnet_r3_recon")]
    assert rc.equivalence_settling(parts, arm, arm, [])["equivalence_seeds"] == str(needed)
    noisy = stats.EffectParts(0.0, 100.0, 3, 100.0, 3, 1e-8, 10_000)  # seeds spread widely; the test set is no floor
    assert rc.effect_settling(noisy, 0.05, [], [], [])["seeds_needed"] == f"more than {power.MAX_SEEDS}"


def test_the_paper_protocols_cost_is_priced_while_either_arm_trained_fewer_than_640_epochs(tmp_path):
    rows = bench_rows(tmp_path)
    full, short = FakeRun("capsnet_r3_recon", images=38_400_000, epochs=640), FakeRun("baseline_cnn", images=3_000_000)
    assert rc.paper_protocol_cost([full], [short], 4, rows) == pytest.approx(
        4 * 60_000 * 640 / 24_000 / 3600 + 4 * 60_000 * 640 / 12_000 / 3600)
