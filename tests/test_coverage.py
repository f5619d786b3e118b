"""scripts/coverage.sh (`make coverage`): the suite under coverage.py, the Python processes it starts
measured too, and a table of each file's missed lines."""

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

ENV = {**os.environ, "BIN": str(Path(sys.executable).parent)}  # this interpreter's, wherever the checkout is

SUITE = '''import subprocess, sys

import pipeline.report.stats


def test_one():
    subprocess.run([sys.executable, "-c", "import pipeline.report.power"], check=True)
'''


def row(table: str, path: str) -> list[str]:
    """The table's row of ``path``: name, statements, missed, cover, missing lines."""
    (line,) = [line for line in table.splitlines() if line.startswith(path)]
    return line.split()


def test_the_table_counts_a_subprocess_lines_and_lists_a_file_no_process_ran(tmp_path):
    """Measuring the folder named: a module only a subprocess imports has its import-time lines counted
    (the process was measured), a module the test imports itself too, and one nothing imports is listed
    with every line missed; a file outside the folder is not listed."""
    (tmp_path / "test_tiny.py").write_text(SUITE)
    done = subprocess.run(["bash", "scripts/coverage.sh", "pipeline/report", "--", str(tmp_path / "test_tiny.py")],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for path in ("pipeline/report/power.py", "pipeline/report/stats.py"):  # power's lines ran in the subprocess alone
        _, statements, missed, *_ = row(done.stdout, path)
        assert 0 < int(missed) < int(statements), done.stdout
    never = row(done.stdout, "pipeline/report/figures.py")
    assert never[1] == never[2] and never[3] == "0%", done.stdout
    assert "pipeline/models/" not in done.stdout  # only the folder named is measured


def test_a_failing_suite_fails_the_run_and_still_prints_what_ran(tmp_path):
    (tmp_path / "test_fails.py").write_text("import pipeline.report.stats\n\n\ndef test_one():\n    assert False\n")
    done = subprocess.run(["bash", "scripts/coverage.sh", "pipeline/report", "--", str(tmp_path / "test_fails.py")],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "the suite failed (pytest exit 1)" in done.stderr, done.stdout + done.stderr
    _, statements, missed, *_ = row(done.stdout, "pipeline/report/stats.py")
    assert int(missed) < int(statements), done.stdout
