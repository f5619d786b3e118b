"""What would settle a claim (pipeline.report.power, report_claims, costs): the power and seeds-needed
arithmetic against hand computation and against simulated experiments, the claim statuses, and the
GPU time taken from each variant's own measured speed."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from pipeline.report import claims as rc
from pipeline.report import costs
from pipeline.report import power
from pipeline.report import stats
from pipeline.report.stats import EffectParts, satterthwaite

Z95, Z80 = 1.959964, 0.841621  # normal quantiles: two-sided 95 %, 80 % power


def test_the_normal_limit_by_hand():
    """With a known SE (ν = ∞) the detectable effect at 80 % power is (z_0.975 + z_0.80)·SE = 2.80·SE."""
    terms = [(0.25, math.inf)]  # SE 0.5
    assert power.detectable(terms) == pytest.approx((Z95 + Z80) * 0.5, rel=1e-4)
    assert power.power((Z95 + Z80) * 0.5, terms) == pytest.approx(0.80, abs=1e-4)
    assert power.power(0.0, terms) == pytest.approx(0.05, abs=1e-6)  # the level, both tails
    # two-sided: the far tail counts (P(Z < −1.96 − 1) is tiny but not zero)
    one_tail = sps.norm.sf(Z95 - 1.0)
    assert power.power(0.5, terms) == pytest.approx(one_tail + sps.norm.cdf(-Z95 - 1.0), rel=1e-6)


def test_few_seeds_need_the_t_distribution():
    """4 degrees of freedom: the critical value is t = 2.776, not 1.96, so the same effect has far less power."""
    terms = [(1.0, 4)]
    assert power.power(0.0, terms) == pytest.approx(0.05, abs=1e-6)
    assert power.power(2.8, terms) < 0.6  # the normal shortcut would say 0.80
    assert power.detectable(terms) > 3.5


def _simulated_power(parts: EffectParts, delta: float, n: int, trials: int = 20000, seed: int = 0) -> float:
    """The share of simulated experiments (n seeds per arm, true difference ``delta``, each arm's seed
    spread and the test-set term as in ``parts``) whose Welch–Satterthwaite 95 % t-interval excludes 0."""
    rng = np.random.default_rng(seed)
    a = rng.normal(delta, math.sqrt(parts.var_a), (trials, n))
    b = rng.normal(0.0, math.sqrt(parts.var_b), (trials, n))
    v_test = parts.terms(n, n)[2][0]
    d = a.mean(1) - b.mean(1) + rng.normal(0.0, math.sqrt(v_test), trials)
    va, vb = a.var(1, ddof=1) / n, b.var(1, ddof=1) / n
    df = np.array([satterthwaite([(x, n - 1), (y, n - 1), (v_test, parts.units - 1)]) for x, y in zip(va, vb)])
    half = sps.t.ppf(0.975, df) * np.sqrt(va + vb + v_test)
    return float(np.mean(np.abs(d) > half))


@pytest.mark.parametrize("var_a, var_b, v_test, delta", [
    (1.0, 1.0, 0.0, 1.0),      # many seeds: n ≈ 17
    (2.25, 0.25, 0.0, 2.0),    # few seeds, unequal arms: t matters (n ≈ 5)
    (0.04, 0.01, 0.002, 0.2),  # a test-set term that more seeds do not remove
])
def test_seeds_needed_reach_80_percent_power_in_simulation_and_fewer_do_not(var_a, var_b, v_test, delta):
    parts = EffectParts(delta, var_a, 3, var_b, 3, v_test, 10_000)
    n = power.effect_seeds_needed(parts, delta)
    assert n is not None and n >= 3
    assert _simulated_power(parts, delta, n) == pytest.approx(0.80, abs=0.035)  # MC SE ≈ 0.003; Welch is approximate
    fewer = n - max(2, n // 4)  # a few seeds fewer per arm: clearly below
    assert _simulated_power(parts, delta, fewer) < 0.75


def test_each_arm_keeps_its_own_seed_variance():
    wide_a = EffectParts(0.0, 4.0, 3, 0.25, 3, 0.0, 10_000)
    wide_b = EffectParts(0.0, 0.25, 3, 4.0, 3, 0.0, 10_000)
    both_wide = EffectParts(0.0, 4.0, 3, 4.0, 3, 0.0, 10_000)
    assert power.effect_seeds_needed(wide_a, 1.0) == power.effect_seeds_needed(wide_b, 1.0)
    assert power.effect_seeds_needed(wide_a, 1.0) < power.effect_seeds_needed(both_wide, 1.0)


def test_more_seeds_average_away_per_image_noise_but_not_the_systematic_part():
    parts = EffectParts(0.1, 0.01, 3, 0.01, 3, 0.003, 10_000, systematic=10.0, within_a=30.0, within_b=30.0)
    assert parts.terms()[2][0] == pytest.approx(0.003)  # at the seeds that ran: the measured term
    assert parts.terms(30, 30)[2][0] == pytest.approx(0.003 * (10 + 2) / (10 + 20))
    assert parts.terms(10 ** 6, 10 ** 6)[2][0] == pytest.approx(0.003 * 10 / 30, rel=1e-4)
    assert parts.floor() == [(pytest.approx(0.003 * 10 / 30), 9_999)]  # unlimited seeds


def test_an_effect_below_the_test_sets_noise_needs_more_seeds_than_any_budget():
    parts = EffectParts(0.0, 0.01, 3, 0.01, 3, 0.04, 10_000)  # test-set SE 0.2 pp, no seed noise in it
    assert power.effect_seeds_needed(parts, 0.05) is None
    assert power.seeds_phrase(None, 0.05) == f"more than {power.MAX_SEEDS}"
    settle = rc.effect_settling(parts, 0.05, [], [], [])
    assert settle["seeds_needed"].startswith("none suffices") and math.isnan(settle["gpu_hours"])


def test_equivalence_margin_is_the_90_percent_interval_two_one_sided_tests():
    terms = [(0.01, math.inf)]  # SE 0.1
    assert power.equivalence_margin(0.05, terms) == pytest.approx(0.05 + 1.644854 * 0.1, rel=1e-5)


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
    captured = "compile-capture: fp32, compile default, the whole step as one CUDA graph"  # starts with "compile"
    levers = [costs.BenchRow("baseline_cnn", h100, f"capsnet-repro {name}", speed, "GPU: one H100")
              for name, speed in ((captured, 50_000.0), ("compile (model+loss)", 20_000.0))]
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


def _effect(effect, paper, lo, hi, seeds="12", hours=1.5, **extra):
    return {"protocol": "p", "effect": effect, "paper_delta": paper, "our_delta": (lo + hi) / 2, "ci_low": lo,
            "ci_high": hi, "status": "", "n_seeds": 3, "seeds_needed": seeds, "gpu_hours": hours,
            "cost_source": "GPU: one H100 | capsnet_r3_recon bf16: 24,000 images/s", "equivalence_margin": math.nan,
            "equivalence_seeds": "–", "equivalence_hours": math.nan, "paper_protocol_hours": math.nan,
            "equivalence_paper_protocol_hours": math.nan} | extra


def test_claims_are_supported_contradicted_or_say_what_would_settle_them():
    table = pd.DataFrame([
        _effect("routing 3 vs 1, with reconstruction", -0.04, -0.30, -0.05),  # wholly on the paper's side
        _effect("reconstruction on vs off, routing 3", -0.10, 0.02, 0.30),  # wholly on the other side
        _effect("CapsNet r3 + recon vs baseline", -0.14, -0.29, 0.06, seeds="10", hours=0.64),
        _effect("official vs paper recipe, routing 3, with reconstruction", math.nan, -0.03, 0.02,
                equivalence_margin=0.03)])
    gap = {"gap": 5.0, "ci_low": 2.0, "ci_high": 8.0, "paper_gap": 13.0, "n_seeds": 3, "seeds_needed": "4",
           "gpu_hours": 1.0, "cost_source": "", "set": "affNIST-style set", "verdict": "smaller gap", "protocol": "p"}
    both = pd.concat([rc.effect_claims(table, "p"), rc.gap_claim(gap)], ignore_index=True)
    claims = both.set_index("evidence").status
    assert claims["routing 3 vs 1, with reconstruction"] == "supported"
    assert claims["reconstruction on vs off, routing 3"] == "contradicted"
    assert claims["CapsNet r3 + recon vs baseline"] == ("not resolvable at 3 seeds — needs 10 per arm to detect the "
                                                         "paper's -0.14 pp at 80 % power, about 0.64 GPU-hours")
    shorter = rc.effect_claims(pd.DataFrame([_effect("reconstruction on vs off, routing 3", -0.10, -0.25, 0.10, seeds="13",
                                                     hours=0.81, paper_protocol_hours=10.4)]), "p")
    assert shorter.status[0].endswith("about 0.81 GPU-hours (about 10 at the paper's 640 epochs, if seeds spread there "
                                      "as here)")
    assert claims["official vs paper recipe, routing 3, with reconstruction"] == "supported: within ±0.03 pp"
    assert claims["§5.2 gap"] == "supported"
    one_seed = rc.effect_claims(pd.DataFrame([_effect("official vs paper recipe, routing 3, with reconstruction",
                                                      math.nan, math.nan, math.nan, status="no interval (one seed)")]), "p")
    assert one_seed.status[0] == "not resolvable: no interval (one seed); settling it needs a second seed of each recipe"
    lines = rc.render_claims(both, "p")
    assert "GPU time from reports/benchmarks.md, GPU: one H100: capsnet_r3_recon bf16: 24,000 images/s." in lines


def test_a_recipe_claim_is_contradicted_beyond_the_noise_and_supported_only_within_the_margin():
    """"Matches": an interval wholly off 0 contradicts it; one within ±EQUIVALENCE_PP supports it; a wider
    margin is not resolvable, with the seeds that would see the margin and their GPU time (the claim's
    hours are the equivalence plan's, not the paper effect's)."""
    def claim(lo, hi, margin):
        effect = _effect("official vs paper recipe, routing 3, with reconstruction", math.nan, lo, hi, hours=9.0,
                         equivalence_margin=margin, equivalence_seeds="30", equivalence_hours=2.5)
        return rc.effect_claims(pd.DataFrame([effect]), "p").iloc[0]
    assert claim(0.01, 0.05, 0.05).status == "contradicted (the recipes differ beyond the noise)"
    assert claim(-0.05, -0.01, 0.05).status == "contradicted (the recipes differ beyond the noise)"
    assert claim(-0.04, 0.04, 0.04).status == "supported: within ±0.04 pp"
    wide = claim(-0.06, 0.06, 0.06)
    assert wide.status == ("not resolvable at 3 seeds (within ±0.06 pp only) — needs 30 per arm to detect a 0.04 pp "
                           "difference (Table 1's smallest effect) at 80 % power, about 2.5 GPU-hours")
    assert wide.gpu_hours == 2.5


def test_a_claim_without_an_interval_says_why_and_the_readme_names_a_protocol_not_the_headline():
    """An effect or §5.2 gap without an interval carries its own reason; GPU time is cited only where
    it was estimated; the README's headline protocol is the first claim's."""
    confounded = _effect("routing 3 vs 1, with reconstruction", -0.04, math.nan, math.nan,  # its plan priced: 24,000
                         status="confounded: no commit in common", our_delta=-0.04)
    no_interval = rc.effect_claims(pd.DataFrame([confounded]), "p")
    assert no_interval.status[0] == "not resolvable: confounded: no commit in common"
    gap = {"gap": 5.0, "ci_low": math.nan, "ci_high": math.nan, "paper_gap": 13.0, "n_seeds": 1, "seeds_needed": "–",
           "gpu_hours": math.nan, "cost_source": "GPU: one H100 | capsnet_affnist bf16: 9,000 images/s",
           "set": "affNIST-style set", "verdict": "one seed: no verdict", "protocol": "q"}
    gap_claim = rc.gap_claim(gap)
    assert gap_claim.status[0] == "not resolvable: one seed: no verdict"
    table = pd.concat([no_interval, gap_claim], ignore_index=True)
    cited = [line for line in rc.render_claims(table, "p") if line.startswith("GPU time from")]
    assert len(cited) == 1 and "24,000" in cited[0] and "9,000" not in cited[0]  # the gap's row priced nothing
    readme = rc.readme_lines(table)
    assert readme[0].endswith("ours -0.04 pp (no interval), paper -0.04 pp.")
    assert readme[1].endswith("ours +5.00 pp (no interval) (affNIST-style set), under q, paper +13 pp (real affNIST).")


def test_seeds_needed_count_up_to_the_budget_itself_and_a_margin_bounds_either_side():
    """The seed budget is inclusive; a difference of zero needs no seeds ('–'); a negative estimate's
    equivalence margin is its lower end's distance from 0."""
    reached_at_5 = lambda n: [(0.0 if n >= 5 else 100.0, 4)]  # noiseless from 5 seeds on
    assert power.seeds_needed(1.0, reached_at_5, max_seeds=5) == 5
    assert power.seeds_needed(1.0, reached_at_5, max_seeds=4) is None
    assert power.seeds_phrase(None, 0.0) == "–" and power.seeds_phrase(None, math.nan) == "–"
    assert power.equivalence_margin(-0.05, [(0.01, math.inf)]) == pytest.approx(0.05 + 1.644854 * 0.1, rel=1e-5)


def test_without_noise_any_difference_is_detected_and_none_is_not():
    """Seeds that agree exactly and no test-set term: SE 0, so the detectable effect is 0 and power is
    1 for any difference, 0 for none (the report prints ±0.00, never ±nan)."""
    assert power.detectable([(0.0, 2), (0.0, 2)]) == 0.0
    assert (power.power(0.01, [(0.0, 2)]), power.power(0.0, [(0.0, 2)])) == (1.0, 0.0)


def test_a_claim_not_resolvable_says_whether_more_seeds_would_settle_it_and_what_they_cost():
    """Beyond the seed budget, beyond any seed count, or a count with its GPU time: whole hours from
    10 on, and why where there is no estimate."""
    def status(seeds, hours=math.nan, why=""):
        return rc.effect_claims(pd.DataFrame([_effect("routing 3 vs 1, with reconstruction", -0.04, -0.30, 0.20,
                                                      seeds=seeds, hours=hours, cost_source=why)]), "p").status[0]
    goal = "detect the paper's -0.04 pp at 80 % power"
    assert status(rc.NONE_SUFFICES) == ("not resolvable at 3 seeds, nor by more: no number of seeds would "
                                        f"{goal} on this test set")
    assert status("more than 100") == f"not resolvable at 3 seeds — would need more than 100 seeds per arm to {goal}"
    assert status("40", 1234.4) == f"not resolvable at 3 seeds — needs 40 per arm to {goal}, about 1,234 GPU-hours"
    unpriced = status("40", why="no bench row for capsnet_r1")
    assert unpriced == (f"not resolvable at 3 seeds — needs 40 per arm to {goal}, GPU time not estimated "
                        "(no bench row for capsnet_r1)")


def test_far_tails_of_the_noncentral_t_give_0_or_1_not_nan():
    """Two smoke seeds (1 degree of freedom) with a tiny spread: scipy's noncentral t returns NaN far in
    its tail, which stopped the smoke run's report; there the power is 1."""
    assert power.power(79.4, [(1e-6, 1.0)]) == 1.0
    assert math.isfinite(power.detectable([(1e-6, 1.0)]))


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
    claim = _effect("CapsNet r3 + recon vs baseline", -0.14, -0.29, 0.06, seeds="10", hours=hours, cost_source=source)
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


def test_hours_read_whole_from_10_on_and_a_phrase_needs_a_seed_count():
    assert [rc.hours_text(h) for h in (0.642, 9.4, 99.6, 1234.4, math.nan)] == ["0.64", "9.4", "100", "1,234", "–"]
    assert rc.hours_phrase("–", math.nan) == "" and rc.hours_phrase("more than 100", 5.0) == ""
    assert rc.hours_phrase("12", math.nan) == ", GPU time not estimated (no bench row)"


def test_a_claim_of_a_positive_effect_reads_its_side_and_each_claim_reads_its_own_protocols_effect():
    """The §5.2 gap (the paper's +13 pp) is supported above 0, contradicted below, not resolvable across
    it; a claim reads its effect under the protocol asked for, not another protocol's; a positive paper
    effect and our interval are signed."""
    def gap(lo, hi):
        return rc.gap_claim({"gap": (lo + hi) / 2, "ci_low": lo, "ci_high": hi, "paper_gap": 13.0, "n_seeds": 3,
                             "seeds_needed": "4", "gpu_hours": 1.0, "cost_source": "", "set": "affNIST-style set",
                             "verdict": "", "protocol": "p"}).status[0]
    assert (gap(2.0, 8.0), gap(-8.0, -2.0)) == ("supported", "contradicted")
    assert gap(-1.0, 5.0).startswith("not resolvable at 3 seeds — needs 4 per arm")
    routing = "routing 3 vs 1, with reconstruction"
    table = pd.DataFrame([_effect(routing, -0.04, -0.30, -0.06),
                          _effect(routing, -0.04, 0.10, 0.30) | {"protocol": "q"}])
    first = rc.effect_claims(table, "p").iloc[0]
    assert (first.status, first.ours, first.protocol) == ("supported", "-0.18 pp [-0.30, -0.06]", "p")
    assert rc.effect_claims(table, "q").status[0] == "contradicted"
    positive = rc.effect_claims(pd.DataFrame([_effect(routing, 0.10, 0.02, 0.30)]), "p").iloc[0]
    assert (positive.paper, positive.ours, positive.status) == ("+0.10 pp", "+0.16 pp [+0.02, +0.30]", "supported")


def test_a_confounded_recipe_claim_says_what_settles_it_then_the_seeds_and_hours_of_the_plan():
    confounded = _effect("official vs paper recipe, routing 3, with reconstruction", math.nan, math.nan, math.nan,
                         status="confounded: no commit in common", equivalence_seeds="30", equivalence_hours=2.5)
    assert rc.effect_claims(pd.DataFrame([confounded]), "p").status[0] == (
        "not resolvable: confounded: no commit in common; settling it needs both recipes at one commit, 30 seeds per "
        "arm to detect a 0.04 pp difference (Table 1's smallest effect) at 80 % power, about 2.5 GPU-hours")


def test_the_paper_protocols_cost_is_priced_while_either_arm_trained_fewer_than_640_epochs(tmp_path):
    rows = bench_rows(tmp_path)
    full, short = FakeRun("capsnet_r3_recon", images=38_400_000, epochs=640), FakeRun("baseline_cnn", images=3_000_000)
    assert rc.paper_protocol_cost([full], [short], 4, rows) == pytest.approx(
        4 * 60_000 * 640 / 24_000 / 3600 + 4 * 60_000 * 640 / 12_000 / 3600)


def test_the_paper_terms_are_the_verdicts_own_and_an_interval_needs_two_seeds():
    """paper_terms is the verdict's interval (stats.against_paper: the paper's σ over its trials with their
    degrees of freedom), and however large the effect, one seed has no interval: two at the least."""
    ours, paper, sigma = [0.30, 0.35, 0.42], 0.25, 0.02
    terms = power.paper_terms(float(np.var(ours, ddof=1)), len(ours), sigma)
    mine, theirs = stats.t_interval(float(np.mean(ours)) - paper, terms), stats.against_paper(ours, paper, sigma)
    assert (mine.lo, mine.hi, mine.df) == pytest.approx((theirs.lo, theirs.hi, theirs.df))
    assert power.seeds_needed(10.0, lambda n: [(0.01 / n, n - 1)]) == 2
