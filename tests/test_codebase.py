"""Guards on the codebase itself: the import direction of DESIGN.md, lint and format."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

LEAVES = ("grid", "placement", "executors")
PROJECT = {*LEAVES, "orchestrator"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("leaf", LEAVES)
def test_leaves_import_nothing_else_of_the_project(leaf):
    for path in (ROOT / leaf).rglob("*.py"):
        foreign = (_imports(path) & PROJECT) - {leaf}
        assert not foreign, f"{path.relative_to(ROOT)} imports {sorted(foreign)}"


def test_heavy_libraries_are_not_imported_by_the_cli():
    code = (
        "import sys; from orchestrator.cli import app; "
        "print(sorted(m for m in ('pandas', 'numpy', 'httpx', 'pynvml', 'apscheduler') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.strip() == "[]"


@pytest.mark.skipif(
    shutil.which("ruff", path=str(Path(sys.executable).parent)) is None,
    reason="ruff is installed with the dev extra",
)
@pytest.mark.parametrize("args", [["check"], ["format", "--check"]])
def test_ruff(args):
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    proc = subprocess.run([ruff, *args, "."], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
