"""The package installs from a built wheel, not only in editable mode: every data file the
code reads ships in it, and a what-if run works from the installed copy alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel, built and unpacked into a directory of its own (its dependencies are the
    test environment's)."""
    tmp = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "-w", str(tmp / "dist"), str(ROOT)],
        check=True,
        capture_output=True,
    )
    wheel = next((tmp / "dist").glob("gridshift-*.whl"))
    site = tmp / "site"
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-compile", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    return site


def _run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site), "GRIDSHIFT_HOME": str(cwd / "home")}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def test_the_wheel_holds_the_data_files(installed):
    assert (installed / "orchestrator" / "planning" / "power_curves.json").is_file()
    assert (installed / "executors" / "gpu" / "base.py").is_file()


def test_a_what_if_runs_from_the_installed_wheel(installed, tmp_path):
    scenario = tmp_path / "whatif.toml"
    scenario.write_text((ROOT / "examples" / "whatif.toml").read_text())
    probe = subprocess.run(
        [sys.executable, "-c", "import orchestrator; print(orchestrator.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(installed)},
    )
    assert probe.stdout.startswith(str(installed)), probe.stdout + probe.stderr
    proc = _run(
        installed, tmp_path, "simulate", str(scenario), "--policy", "lowest-window", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data["policies"]) >= {"fifo", "lowest-window"}


def test_the_wheel_creates_and_upgrades_a_database(installed, tmp_path):
    """The migrations ship: a new database is created at head from the installed copy,
    and an older one (made by a gridshift before migrations) is upgraded by it."""
    import sqlite3

    assert (installed / "orchestrator" / "queue" / "migrations" / "env.py").is_file()
    versions = installed / "orchestrator" / "queue" / "migrations" / "versions"
    assert sorted(p.name for p in versions.glob("0*.py")) == sorted(
        p.name for p in (ROOT / "orchestrator" / "queue" / "migrations" / "versions").glob("0*.py")
    )
    fresh = _run(installed, tmp_path, "db", "status", "--json")
    assert fresh.returncode == 0, fresh.stderr
    head = json.loads(fresh.stdout)["head"]
    assert _run(installed, tmp_path, "ls").returncode == 0  # created at head
    assert json.loads(_run(installed, tmp_path, "db", "status", "--json").stdout)["current"] == head

    old = tmp_path / "old"
    old.mkdir()
    (old / "home").mkdir()
    ddl = (ROOT / "tests" / "fixtures" / "schema-pre20.sqlite.sql").read_text()
    conn = sqlite3.connect(old / "home" / "gridshift.db")
    conn.executescript(ddl)
    conn.close()
    assert _run(installed, old, "ls").returncode == 2
    upgraded = _run(installed, old, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    status = json.loads(_run(installed, old, "db", "status", "--json").stdout)
    assert status["current"] == head and status["up_to_date"]
