"""The published report is what today's code makes of the published runs: regenerated from
reports/runs (nothing retrained), every file the report stage writes is byte for byte the one in
git, but for the three provenance lines that name the report's own commit, software and date. A refactor that
changes a number, a sentence, a figure or a CSV of the published report fails here; a deliberate
change is published by regenerating (README's "Reproducing the published report" says how)."""

import difflib
import filecmp
import json
import re
import shutil

import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import REPO
from pipeline.cli import main
from pipeline.report import publish
from pipeline.report.document import README_BEGIN, README_END, readme_block_of

PUBLISHED = REPO / "reports"
OWN_LINES = re.compile(r"^- \*\*(report commit|report software|date)\*\*: .*$", re.M)  # the regeneration's own


def regenerate(runs, out, readme):
    """`capsnet report` on a run-records folder as gpu_import.sh runs it."""
    return CliRunner().invoke(main, ["report", str(runs / "models"), str(runs / "results"), str(out),
                                     "--params", str(runs / "params.yaml"), "--missing", "list",
                                     "--readme", str(readme), "--benchmarks", str(PUBLISHED / "benchmarks.md"),
                                     "--fingerprints", str(runs / "fingerprints")])


def test_the_published_report_regenerates_byte_for_byte(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    readme = tmp_path / "README.md"
    committed = (REPO / "README.md").read_text()
    outdated = README_BEGIN + "\nstale\n" + README_END  # what --readme must write over
    readme.write_text(committed.replace(readme_block_of(committed), outdated))
    out = tmp_path / "reports"
    result = regenerate(PUBLISHED / "runs", out, readme)
    assert result.exit_code == 0, result.output
    claims = pd.read_csv(PUBLISHED / "claims.csv")
    for claim, status in zip(claims.claim, claims.status):  # the verdicts in the terminal too
        assert f"  {claim}: {status}\n" in result.output
    written = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert len(written) > 15
    for name in written:
        if name.name == "ablation.md":
            assert OWN_LINES.sub("", (out / name).read_text()) == OWN_LINES.sub("", (PUBLISHED / name).read_text())
        else:
            assert filecmp.cmp(out / name, PUBLISHED / name, shallow=False), f"reports/{name} differs"
    stale = {p.relative_to(PUBLISHED) for p in (PUBLISHED / "metrics").iterdir()} - set(written)
    assert not stale, f"published metrics the report no longer writes: {sorted(map(str, stale))}"
    assert readme.read_text() == committed  # the block rewritten as committed, the rest untouched


OTHER_PROTOCOLS = {  # what a later window may train seed 0 under: the paper's length, or its own again
    "paper length": lambda cfg: cfg | {"epochs": 640},
    "its own again": lambda cfg: cfg,
}


@pytest.mark.parametrize("protocol", OTHER_PROTOCOLS)
def test_a_window_that_has_only_begun_a_protocol_leaves_the_published_claims_as_they_are(tmp_path, monkeypatch,
                                                                                         protocol):
    """The next GPU window's import, rehearsed on the published records: seed 0 of the first Table 1
    variant and of §5.2's CapsNet retrained and published (`capsnet publish` sets the records they
    displace aside to earlier/). Under another protocol it adds rows of one seed, and the claims, their
    protocols and the README's block read the protocol whose seeds are all there, as before (a
    paper-length protocol heads the report only once it has as many runs); the block adds the new
    protocol's Table 1 apart and changes none of its published lines. Under its own
    protocol and training code it is the same seed again: the later record counts, once
    (`publish.one_per_seed`), and the report names the one it supersedes."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    runs = tmp_path / "runs"
    shutil.copytree(PUBLISHED / "runs", runs)
    incoming = tmp_path / "incoming"  # the window's evaluated runs: copies of the published seed 0s, retrained
    for variant in ("capsnet_r1", "capsnet_affnist"):
        for kind in publish.PUBLISHED:
            shutil.copytree(runs / kind / variant / "seed0", incoming / kind / variant / "seed0")
        config = incoming / "models" / variant / "seed0" / "config.json"
        record = json.loads(config.read_text())
        config.write_text(json.dumps(record | {"config": OTHER_PROTOCOLS[protocol](record["config"]),
                                               "run_id": f"{record['run_id']}-next"}))
    assert len(publish.publish_runs(incoming / "models", incoming / "results", runs)) == 2  # as gpu_import.sh does
    readme = tmp_path / "README.md"
    readme.write_text((REPO / "README.md").read_text())
    result = regenerate(runs, tmp_path / "reports", readme)
    assert result.exit_code == 0, result.output
    before, after = (pd.read_csv(d / "claims.csv") for d in (PUBLISHED, tmp_path / "reports"))
    columns = ["claim", "ours", "status", "protocol"]
    pd.testing.assert_frame_equal(after[columns], before[columns])
    published, now = (readme_block_of(p.read_text()).splitlines() for p in (REPO / "README.md", readme))
    changed = [d for d in difflib.ndiff(published, now) if d[:2] in ("- ", "+ ")]
    assert not [d for d in changed if d.startswith("- ")], changed  # no published line changed or gone
    added = "\n".join(d[2:] for d in changed).strip()  # a protocol of its own: its Table 1 apart, its one run
    assert added.startswith("Protocol: **gpu profile: 640 epochs") and ", 1 run, never pooled" in added \
        if protocol == "paper length" else added == ""
    again = "capsnet_r1 seed 0: run " in result.output
    assert again == (protocol == "its own again"), result.output
    named = "**trained again, the earlier record not counted**: capsnet_r1 seed 0 (run "
    assert (named in (tmp_path / "reports" / "ablation.md").read_text()) == again
    rows = pd.read_csv(tmp_path / "reports" / "results.csv").query("variant == 'capsnet_r1'")
    assert len(rows) == len(pd.read_csv(PUBLISHED / "results.csv").query("variant == 'capsnet_r1'")) + (not again)
