"""The layers' import contract (pyproject's [tool.importlinter]) holds, and fails on a planted
violation: a torch import in the analysis layer, a report import from results."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def lint(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                           "lint_imports_command()", "--no-cache"],
                          cwd=tree, env={"PYTHONPATH": str(tree / "src"), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def tree(tmp_path):
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "src" / "dpbench", tmp_path / "src" / "dpbench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_the_contract_holds(tree):
    out = lint(tree)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("analysis/tables.py", "import torch", "never import torch"),
    ("results/__init__.py", "from dpbench.report import markdown", "Layers point one way"),
    ("plan/matrix.py", "import seaborn", "matplotlib and seaborn only"),
])
def test_a_planted_violation_breaks_it(tree, module, line, contract):
    path = tree / "src" / "dpbench" / module
    path.write_text(path.read_text() + f"\n{line}  # planted\n")
    out = lint(tree)
    assert out.returncode != 0
    broken = " ".join(out.stdout.split("Broken contracts")[-1].split())   # lint-imports wraps lines
    assert contract in broken
    assert module.removesuffix(".py").replace("/", ".").removesuffix(".__init__") in broken
