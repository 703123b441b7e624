"""Guards on the codebase itself: the import direction of DESIGN.md, the rooms of
``orchestrator/`` and their import rules, sizes, lint and format."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

LEAVES = ("grid", "placement", "executors")
PROJECT = {*LEAVES, "orchestrator"}
ROOT_MODULES = {"errors", "clock", "settings", "timeparse"}
ROOMS = ("queue", "planning", "accounting", "nodes", "signals", "daemon", "sim", "cli", "api")
# executors' concrete backends: only orchestrator/nodes/ names them (the simulator runs
# its own, the simulated executor, on simulated time)
BACKENDS = re.compile(
    r"^executors\.(local|ssh|sshlink|slurm|router|remote|shim|bundle|gpu\.(nvml|smi|fake))$"
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports (full dotted names, lazy imports included)."""
    tree = ast.parse(path.read_text())
    package = (
        _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    )
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            names.add(module)
            # ``from pkg import mod``: the submodule itself, where it is one
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                if (ROOT / (sub.replace(".", "/") + ".py")).exists() or (
                    ROOT / sub.replace(".", "/") / "__init__.py"
                ).exists():
                    names.add(sub)
    return names


def _project_files(top: str) -> list[Path]:
    return sorted(p for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for top in PROJECT for p in _project_files(top)}
    graph = {}
    for name, path in modules.items():
        # a package's own __init__ is not an edge of its submodules (Python runs it first,
        # but it is not what the submodule depends on)
        graph[name] = {m for m in _imported(path) if m in modules and m != name}
    return graph


def _room(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "orchestrator":
        return parts[0]
    if len(parts) > 1 and parts[1] == "__main__":
        return "cli"  # the entry point: ``python -m orchestrator`` is the CLI
    if len(parts) == 1 or parts[1] in ROOT_MODULES:
        return "root"
    return parts[1]


@pytest.mark.parametrize("leaf", LEAVES)
def test_leaves_import_nothing_else_of_the_project(leaf):
    for path in _project_files(leaf):
        foreign = {m.split(".")[0] for m in _imported(path)} & PROJECT - {leaf}
        assert not foreign, f"{path.relative_to(ROOT)} imports {sorted(foreign)}"


# what each room of orchestrator/ may import of the others (the root: errors, clock,
# settings, timeparse; leaves are checked separately below)
MAY_IMPORT = {
    # settings validates a budget with its parser, the one pure type it needs
    # and reads GRIDSHIFT_* as the thin client does, with the client's own reader
    "root": {"root", "planning.budgets", "api.environ"},
    "queue": {"root", "queue"},
    "planning": {"planning", "errors", "timeparse"},
    "signals": {"root", "signals"},
    # its figures draw users' text through the one place that makes text safe to show
    "accounting": {"root", "queue", "planning", "accounting", "signals.redact"},
    "nodes": {"root", "queue", "nodes"},
    "daemon": {"root", "queue", "planning", "accounting", "nodes", "signals", "daemon", "api"},
    "sim": {"root", "queue", "planning", "signals", "sim"},
    "cli": {"root", *ROOMS},
    # the socket's protocol and thin client: the standard library and the error tree only
    "api": {"api", "errors"},
}


def _allowed(room: str, target: str) -> bool:
    allowed = MAY_IMPORT[room]
    parts = target.split(".")
    if parts[0] != "orchestrator":
        return True
    target_room = _room(target)
    if target_room == "root":
        return "root" in allowed or (len(parts) > 1 and parts[1] in allowed)
    return target_room in allowed or ".".join(parts[1:3]) in allowed


def test_rooms_import_only_what_their_rule_allows():
    bad = []
    for module, deps in _graph().items():
        if not module.startswith("orchestrator"):
            continue
        room = _room(module)
        bad += [f"{module} -> {d}" for d in sorted(deps) if not _allowed(room, d)]
    assert not bad, "\n".join(bad)


def test_planning_has_no_database_wall_clock_or_settings():
    for path in _project_files("orchestrator/planning"):
        text = path.read_text()
        names = _imported(path)
        assert not {n for n in names if n.split(".")[0] in ("sqlmodel", "sqlalchemy")}, path
        assert "orchestrator.settings" not in names, path
        for call in ("datetime.now(", "time.time(", "time.monotonic(", "date.today("):
            assert call not in text, f"{path.relative_to(ROOT)} reads the wall clock: {call}"


def test_only_nodes_names_concrete_backends():
    bad = []
    for module, deps in _graph().items():
        room = _room(module)
        if not module.startswith("orchestrator") or room == "nodes":
            continue
        bad += [f"{module} -> {d}" for d in sorted(deps) if BACKENDS.match(d)]
    assert not bad, "\n".join(bad)


def test_no_import_circle():
    graph = _graph()
    # a module reaching itself through others is a circle; a package importing its own
    # submodules (a registry, a factory) is allowed only when none imports it back
    seen: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        seen[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if seen.get(nxt) == 1:
                circles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in seen:
                visit(nxt)
        stack.pop()
        seen[node] = 2

    for node in sorted(graph):
        if node not in seen:
            visit(node)
    assert not circles, "\n".join(circles)


def test_the_house_is_in_rooms():
    loose = sorted(p.name for p in (ROOT / "orchestrator").glob("*.py"))
    assert len(loose) <= 6, loose
    for top in PROJECT:
        for folder in [ROOT / top, *(p for p in (ROOT / top).rglob("*") if p.is_dir())]:
            if "__pycache__" in folder.parts:
                continue
            files = [p for p in folder.iterdir() if p.is_file() and p.suffix != ".pyc"]
            assert len(files) <= 15, f"{folder.relative_to(ROOT)} holds {len(files)} files"
        for path in _project_files(top):
            lines = len(path.read_text().splitlines())
            assert lines <= 450, f"{path.relative_to(ROOT)} has {lines} lines"


def test_every_room_says_what_it_holds_and_may_import():
    for room in ROOMS:
        doc = ast.get_docstring(
            ast.parse((ROOT / "orchestrator" / room / "__init__.py").read_text())
        )
        assert doc and "import" in doc, f"orchestrator/{room}/__init__.py"


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


def test_submit_and_show_without_a_daemon_load_no_numpy_nor_pandas(tmp_path):
    """Issue 24's GPU types had brought numpy into ``submit`` (0.03 s of every one)."""
    code = (
        "import runpy, sys\n"
        "try:\n    runpy.run_module('orchestrator', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print(sorted(m for m in ('pandas', 'numpy') if m in sys.modules), file=sys.stderr)"
    )
    env = {**os.environ, "GRIDSHIFT_HOME": str(tmp_path)}
    for argv in (["submit", "--gpus", "1", "--", "true"], ["show", "1"]):
        proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                              text=True, cwd=tmp_path, env=env)  # fmt: skip
        assert proc.stderr.strip().splitlines()[-1] == "[]", (argv, proc.stderr)


@pytest.mark.skipif(
    shutil.which("ruff", path=str(Path(sys.executable).parent)) is None,
    reason="ruff is installed with the dev extra",
)
@pytest.mark.parametrize("args", [["check"], ["format", "--check"]])
def test_ruff(args):
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    proc = subprocess.run([ruff, *args, "."], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
