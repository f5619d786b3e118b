"""§5.2's section of the report on fabricated runs: the CapsNet − CNN gap on the affNIST-style set, its
verdict and the protocol and rows it reads, the transform bins, the README's line."""

import math

import pytest

from report_runs import COMMIT, REFERENCE, fabricate, fabricate_cnn_affnist, load
from pipeline.experiments import affnist_report as ra
from pipeline.report import claims as rc
from pipeline.report import document as rp


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


def test_a_52_section_of_one_model_lists_its_row_and_states_no_gap_claim_or_metric(tmp_path, monkeypatch):
    """A window that has trained §5.2's CapsNet but not yet its CNN: the section shows the CapsNet's row
    and says why it states no gap; without a gap there is no claim and no headline metric."""
    from conftest import committed_params
    from pipeline.experiments import affnist

    for seed in (0, 1):
        fabricate(tmp_path, "capsnet_affnist", seed, 1.0, affine_pct=21.0 + 2 * seed, image_size=40)
    runs = load(tmp_path, ["capsnet_affnist"], [0, 1])
    assert ra.affnist_gap(runs, REFERENCE) is None
    monkeypatch.setattr(affnist.figures, "accuracy_by_transform", lambda *args: None)
    (tmp_path / "figures").mkdir()
    section = affnist.report(runs, rp.Context(committed_params(), REFERENCE, [], tmp_path / "results", tmp_path))
    assert section.claims is None and section.headline == {}
    text = "\n".join(section.lines)
    assert "| capsnet_affnist | c0ffee0 | 8,215,568 | 2 | 99.00 ± 0.00 | 99.00 99.00 | 78.00 ± 1.41 |" in text
    assert ("**CapsNet − CNN on affNIST(-style): no gap yet**: it needs runs of both models, and only capsnet_affnist "
            "has them here") in text


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
