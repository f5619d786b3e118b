"""The README's results cannot drift from the published report's tables."""

import pandas as pd
import pytest
from conftest import REPO

from pipeline.core import registry
from pipeline.core.errors import UserError
from pipeline.report import document as rp
from pipeline.stages import report as report_stage


def published_block() -> str:
    return report_stage.readme_block(REPO / "reports", [registry.load(name) for name in registry.names()])


def test_readme_results_block_is_the_one_the_published_tables_give():
    block = rp.readme_block_of((REPO / "README.md").read_text())
    assert block, "README.md has no generated results block"
    assert block == published_block(), (
        "README.md's results block differs from reports/*.csv: run `capsnet report reports/runs/models "
        "reports/runs/results reports --params reports/runs/params.yaml --missing list --readme README.md`")


def test_the_block_states_every_row_and_effect_of_the_first_protocol():
    block = published_block()
    results = pd.read_csv(REPO / "reports" / "results.csv")
    first = results[results.protocol == results.protocol.iloc[0]]
    for r in first.itertuples():
        std = "–" if pd.isna(r.test_error_std) else f"{r.test_error_std:.2f}"  # one seed: no spread
        assert f"{r.test_error_mean:.2f} ± {std}: {r.verdict}" in block, r.variant
    effects = pd.read_csv(REPO / "reports" / "effects.csv")
    for e in effects[effects.protocol == results.protocol.iloc[0]].itertuples():
        assert f"- {e.effect}: {e.our_delta:+.2f}" in block and e.status in block
    for c in pd.read_csv(REPO / "reports" / "claims.csv").itertuples():  # every claim with its status
        assert f"- {c.claim}: **{c.status}**" in block


def test_rewrite_replaces_only_the_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{rp.README_BEGIN}\nold numbers\n{rp.README_END}\ncontext\n")
    rp.rewrite_readme(readme, f"{rp.README_BEGIN}\nnew\n{rp.README_END}")
    assert readme.read_text() == f"intro\n{rp.README_BEGIN}\nnew\n{rp.README_END}\ncontext\n"
    assert rp.readme_block_of(readme.read_text()) == f"{rp.README_BEGIN}\nnew\n{rp.README_END}"
    readme.write_text("no markers\n")
    with pytest.raises(UserError, match="has no generated results block"):
        rp.rewrite_readme(readme, "x")
    assert readme.read_text() == "no markers\n"


def test_a_block_begun_but_never_ended_is_refused_and_read_as_none(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{rp.README_BEGIN}\nold numbers, the end marker deleted\n")
    with pytest.raises(UserError, match="has no generated results block"):
        rp.rewrite_readme(readme, "x")
    assert rp.readme_block_of(readme.read_text()) == ""
    assert readme.read_text() == f"intro\n{rp.README_BEGIN}\nold numbers, the end marker deleted\n"
