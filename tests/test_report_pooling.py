"""Which runs make one row of the report (on fabricated runs): never two protocols or two training
codes; one training fingerprint across commits and hosts; the headline protocol; an effect's pair of rows."""

import json
import math

import pandas as pd
import pytest

from report_runs import COMMIT, REFERENCE, fabricate, load, markdown
from pipeline.core import lineage, protocol
from pipeline.experiments import table1_figures as t1_figures
from pipeline.experiments import table1_readme as t1_readme
from pipeline.experiments import table1_report as t1
from pipeline.report import document as rp
from pipeline.report import publish
from pipeline.report import runs as rr
from pipeline.report.rows import bridge, protocols, same_code
from pipeline.training.config import ADAM_EPS


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
    readme = t1_readme.readme_lines(t1.summarize(runs, REFERENCE), t1.effects(runs, REFERENCE))
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
    readme = t1_readme.readme_lines(summary.reset_index(), t1.effects(bridge(runs, [good]), REFERENCE))
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
