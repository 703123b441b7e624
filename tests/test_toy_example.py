"""``examples/train_toy.py``: its checkpoint is the job's own, so a new job starts from
epoch 0 while a resumed attempt of the same job goes on where it stopped (a checkpoint in
the working directory made the next toy job "resume from epoch 46")."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

TOY = str(ROOT / "examples" / "train_toy.py")
pytestmark = pytest.mark.backends("sqlite")


def _attempt(
    tmp: Path, job: int, attempt: int, *, stop_after_s: float | None = None, key: str = ""
) -> str:
    """Run the toy as the executor runs one attempt: its own run directory (under the
    queue's run/ folder), GRIDSHIFT_JOB_ID and GRIDSHIFT_PROGRESS_FILE; SIGTERM it after
    ``stop_after_s`` (a suspension)."""
    run_dir = tmp / "home" / "run" / f"attempt-{attempt}"
    run_dir.mkdir(parents=True, exist_ok=True)  # a reused attempt id: its dir again
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp / "cache"),
        "GRIDSHIFT_JOB_ID": str(job),
        "GRIDSHIFT_JOB_KEY": key or f"{job}-1700000000000000",
        "GRIDSHIFT_PROGRESS_FILE": str(run_dir / "progress"),
    }
    proc = subprocess.Popen(
        [sys.executable, TOY, "--epochs", "40", "--epoch-seconds", "0.05"],
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    if stop_after_s is not None:
        time.sleep(stop_after_s)
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    return out


def test_a_new_job_starts_fresh_and_a_resumed_one_goes_on(tmp_path):
    first = _attempt(tmp_path, job=1, attempt=1, stop_after_s=0.8)
    assert "from epoch 0" in first and "SIGTERM: checkpointed after" in first
    assert not list(tmp_path.glob("*.json"))  # nothing left in the working directory
    other = _attempt(tmp_path, job=2, attempt=2)  # another job, the same directory
    assert "from epoch 0" in other and "training finished" in other
    again = _attempt(tmp_path, job=1, attempt=3)  # job 1's next attempt
    start = int(again.split("from epoch ")[1].split()[0])
    assert start > 0 and "training finished" in again
    assert not list((tmp_path / "cache").rglob("*.json"))  # removed once finished


def test_a_job_that_gets_a_cleaned_jobs_id_starts_fresh(tmp_path):
    """``clean`` removes the highest job and SQLite hands its id to the next one: the
    toy's checkpoint is keyed by the job's key (id and submission time), not its id."""
    cancelled = _attempt(tmp_path, job=4, attempt=1, stop_after_s=0.8, key="4-100")
    assert "SIGTERM: checkpointed after" in cancelled
    reused = _attempt(tmp_path, job=4, attempt=1, key="4-200")  # a new job 4
    assert "from epoch 0" in reused and "training finished" in reused


def test_the_executor_gives_each_job_its_own_key_even_when_ids_come_back(cli, tmp_path):
    """Job ids never come back after ``clean``, but a new database starts them at 1 again;
    GRIDSHIFT_JOB_KEY does not come back, and a job cannot set it itself."""
    seen = tmp_path / "keys"
    script = f"import os; open({str(seen)!r}, 'a').write(os.environ['GRIDSHIFT_JOB_KEY'] + chr(10))"
    first = cli.submit("--now", "--env", "GRIDSHIFT_JOB_KEY=forged", "--", sys.executable, "-c",
                       script)  # fmt: skip
    cli.run_until_idle()
    for path in cli.home.glob("gridshift.db*"):  # a new queue here: ids start again
        path.unlink()
    shutil.rmtree(cli.home / "run")  # (its old run directories moved away)
    second = cli.submit("--now", "--", sys.executable, "-c", script)
    cli.run_until_idle()
    keys = seen.read_text().split()
    assert first == second  # the id came back
    assert len(keys) == 2 and keys[0] != keys[1] and "forged" not in keys, keys
    assert all(k.startswith(f"{first}-") for k in keys), keys
