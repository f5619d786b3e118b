"""The report stage on fabricated runs: every declared output whatever the variants, the fingerprint
tables it reads, what it needs and logs, and the data the figures are handed (the figures
themselves: tests/test_figures.py)."""

import json
import math

import pandas as pd
import pytest
import yaml
from scipy import stats as sp

from conftest import with_ablation
from report_runs import COMMIT, REFERENCE, edit_record, fabricate, fabricate_cnn_affnist, load
from pipeline.experiments import table1_figures as t1_figures
from pipeline.experiments import table1_report as t1
from pipeline.report import document as rp
from pipeline.report import runs as rr


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
