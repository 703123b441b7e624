"""The package installs from a built wheel, not only in editable mode: the wheel goes
into a fresh virtual environment (no network: its dependencies are the test
environment's, reached through a ``.pth`` file behind the venv's own site-packages), and
that venv's ``gridshift`` script runs a what-if and a short carbon-aware daemon. Every
data file the code reads (``Path(__file__)`` siblings) ships in the wheel."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import ROOT

PY = "python{}.{}".format(*sys.version_info[:2])
NOT_SOURCES = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache")


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed: returns the venv's folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # built from a copy of the sources: a build/ folder left in the checkout (by an
    # interrupted build, or another running at once) made setuptools fail with EEXIST
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    subprocess.run(
        [*pip, "wheel", "--no-deps", "-w", str(tmp / "dist"), str(src)],
        check=True,
        capture_output=True,
    )
    wheel = next((tmp / "dist").glob("gridshift-*.whl"))
    env_dir = tmp / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, env=_env()
    )
    site = _site(env_dir)
    # the test environment's packages (pandas, sqlmodel, pip ...) behind the venv's own;
    # a directory named in a .pth file is added as it is: the editable install of this
    # checkout there (its own .pth finder) is not activated, so the wheel's copy is used
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q",
         "install", "--no-deps", "--no-index", "--no-compile", str(wheel)],
        check=True, capture_output=True, env=_env(),
    )  # fmt: skip
    return env_dir


def _site(env_dir: Path) -> Path:
    return env_dir / "lib" / PY / "site-packages"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRIDSHIFT_", "PYTHON"))}
    return {**env, **extra}


def _run(env_dir: Path, cwd: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    env = _env(GRIDSHIFT_HOME=str(cwd / "home"), **extra)
    return subprocess.run(
        [str(env_dir / "bin" / "gridshift"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def test_the_venv_imports_the_wheel_not_this_checkout(venv, tmp_path):
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import orchestrator, grid, executors, placement;"
         "print(orchestrator.__file__, grid.__file__, executors.__file__, placement.__file__)"],
        capture_output=True, text=True, cwd=tmp_path, env=_env(),
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    for path in probe.stdout.split():
        assert path.startswith(str(_site(venv))), probe.stdout


def _data_files_read() -> set[str]:
    """Files the code opens next to its own modules: ``Path(__file__).with_name(X)``
    (a file or a folder) and executors.bundle's FILES."""
    found = set()
    for top in ("orchestrator", "grid", "placement", "executors"):
        for path in (ROOT / top).rglob("*.py"):
            for name in re.findall(
                r"Path\(__file__\)\.with_name\(\"([^\"]+)\"\)", path.read_text()
            ):
                target = path.parent / name
                files = [target] if target.is_file() else sorted(target.rglob("*"))
                found |= {
                    str(f.relative_to(ROOT))
                    for f in files
                    if f.is_file() and "__pycache__" not in f.parts
                }
    from executors.bundle import FILES

    found |= {f"executors/{name}" for name in FILES}
    return found


def test_the_wheel_holds_every_data_file_the_code_reads(venv):
    wanted = _data_files_read()
    assert "orchestrator/planning/power_curves.json" in wanted
    assert "orchestrator/queue/migrations/script.py.mako" in wanted
    missing = sorted(f for f in wanted if not (_site(venv) / f).is_file())
    assert not missing, missing


def test_a_what_if_runs_from_the_installed_wheel(venv, tmp_path):
    scenario = tmp_path / "whatif.toml"
    scenario.write_text((ROOT / "examples" / "whatif.toml").read_text())
    proc = _run(venv, tmp_path, "simulate", str(scenario), "--policy", "lowest-window", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data["policies"]) >= {"fifo", "lowest-window"}


def test_a_carbon_aware_daemon_runs_a_job_from_the_installed_wheel(venv, tmp_path):
    """``daemon --grid synthetic:...`` plans on a signal, runs one job to completion on
    fake GPUs and accounts its carbon, all from the venv."""
    from datetime import UTC, datetime, timedelta

    day = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    fake = {"GRIDSHIFT_FAKE_GPUS": "2", "GRIDSHIFT_FAKE_GPU_POWER_W": "200"}
    sub = _run(venv, tmp_path, "submit", "--now", "--gpus", "1", "--", "sleep", "0.5", **fake)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip()
    grid = f"synthetic:start={day}&days=3"
    daemon = _run(
        venv, tmp_path, "daemon", "--grid", grid, "--until-idle", "--interval", "0.2", **fake
    )
    assert daemon.returncode == 0, daemon.stderr
    shown = json.loads(_run(venv, tmp_path, "show", job, "--json", **fake).stdout)
    assert shown["state"] == "completed", shown
    assert shown["runs"][0]["carbon_g"] is not None and shown["runs"][0]["carbon_g"] > 0


def test_the_wheel_creates_and_upgrades_a_database(venv, tmp_path):
    """The migrations ship: a new database is created at head from the installed copy,
    and an older one (made by a gridshift before migrations) is upgraded by it."""
    import sqlite3

    assert (_site(venv) / "orchestrator" / "queue" / "migrations" / "env.py").is_file()
    versions = _site(venv) / "orchestrator" / "queue" / "migrations" / "versions"
    assert sorted(p.name for p in versions.glob("0*.py")) == sorted(
        p.name for p in (ROOT / "orchestrator" / "queue" / "migrations" / "versions").glob("0*.py")
    )
    fresh = _run(venv, tmp_path, "db", "status", "--json")
    assert fresh.returncode == 0, fresh.stderr
    head = json.loads(fresh.stdout)["head"]
    assert _run(venv, tmp_path, "ls").returncode == 0  # created at head
    assert json.loads(_run(venv, tmp_path, "db", "status", "--json").stdout)["current"] == head

    old = tmp_path / "old"
    old.mkdir()
    (old / "home").mkdir()
    ddl = (ROOT / "tests" / "fixtures" / "schema-pre20.sqlite.sql").read_text()
    conn = sqlite3.connect(old / "home" / "gridshift.db")
    conn.executescript(ddl)
    conn.close()
    assert _run(venv, old, "ls").returncode == 2
    upgraded = _run(venv, old, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    status = json.loads(_run(venv, old, "db", "status", "--json").stdout)
    assert status["current"] == head and status["up_to_date"]
