"""Pyflakes' checks (ruff's F rules) over the package, the scripts and the tests: an undefined name, an
unused import or variable, a redefinition. CI never runs the CUDA-only paths (the captured step on a
GPU, the CUDA tests, the GPU session's scripts), so an undefined name there would first fail in a
GPU window, whose minutes are the scarcest this project has; this finds it on any machine."""

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

CHECKED = ("pipeline", "scripts", "tests")


def pyflakes(root: Path) -> subprocess.CompletedProcess:
    """ruff (the lock's, beside this interpreter) with only the F rules, ignoring any configuration."""
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip(f"no ruff beside {sys.executable}: `make venv` installs the lock's dev group")
    return subprocess.run([str(ruff), "check", "--isolated", "--select", "F", "--output-format", "concise",
                           "--no-cache", *CHECKED], cwd=root, capture_output=True, text=True, timeout=120)


def test_pyflakes_finds_nothing_in_the_package_the_scripts_and_the_tests():
    result = pyflakes(REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_undefined_name_in_a_cuda_only_branch_is_found(tmp_path):
    """What the check is for: a name no CPU run reaches, reported with its file and line."""
    for part in CHECKED:
        (tmp_path / part).mkdir()
    (tmp_path / "pipeline" / "step.py").write_text(
        "import torch\n\n\ndef step(x):\n    if torch.cuda.is_available():\n        return graph.replay(x)\n"
        "    return x\n")
    result = pyflakes(tmp_path)
    assert result.returncode == 1 and "pipeline/step.py:6:16: F821 Undefined name `graph`" in result.stdout
