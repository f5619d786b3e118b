"""The published report is what today's code makes of the published runs: regenerated from
reports/runs (nothing retrained), every file the report stage writes is byte for byte the one in
git, but for the three provenance lines that name the report's own commit, software and date. A refactor that
changes a number, a sentence, a figure or a CSV of the published report fails here; a deliberate
change is published by regenerating (README's "Reproducing the published report" says how)."""

import filecmp
import re

import pandas as pd
from click.testing import CliRunner

from conftest import REPO
from pipeline.cli import main
from pipeline.report.document import readme_block_of

PUBLISHED = REPO / "reports"
OWN_LINES = re.compile(r"^- \*\*(report commit|report software|date)\*\*: .*$", re.M)  # the regeneration's own


def test_the_published_report_regenerates_byte_for_byte(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    readme = tmp_path / "README.md"
    readme.write_text((REPO / "README.md").read_text())
    out = tmp_path / "reports"
    runs = PUBLISHED / "runs"
    result = CliRunner().invoke(main, ["report", str(runs / "models"), str(runs / "results"), str(out),
                                       "--params", str(runs / "params.yaml"), "--missing", "list",
                                       "--readme", str(readme), "--benchmarks", str(PUBLISHED / "benchmarks.md"),
                                       "--fingerprints", str(runs / "fingerprints")])
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
    assert readme_block_of(readme.read_text()) == readme_block_of((REPO / "README.md").read_text())
