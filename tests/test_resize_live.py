"""Resizing live: the real CLI and daemon on four fake GPUs. An elastic toy job
(``--gpus 2-4 --interruptible``; ``examples/train_toy.py`` learns its width from
``GRIDSHIFT_GPUS``) starts on the two GPUs a fixed job leaves free, grows to four once
that job ends (SIGTERM, checkpoint, relaunch), resumes from its checkpoint and completes;
its runs account each width."""

from __future__ import annotations

import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.conftest import E2E

pytestmark = E2E

ROOT = Path(__file__).resolve().parent.parent
TOY = str(ROOT / "examples" / "train_toy.py")
PY = sys.executable
POWER_W = 200.0  # each fake GPU's draw


def _flat_trace(path: Path, t0: int) -> None:
    rows = ["time,carbon_g_per_kwh"]
    rows += [f"{datetime.fromtimestamp(t0 + i, UTC).isoformat()},200" for i in range(-120, 900)]
    path.write_text("\n".join(rows) + "\n")


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


@pytest.mark.slow
@pytest.mark.backends("sqlite")  # the pass's decisions, not the store's backend
def test_an_elastic_job_grows_from_two_to_four_gpus_when_two_free_up(cli, tmp_path):
    cli.env.update(
        {
            "GRIDSHIFT_FAKE_GPU_POWER_W": str(POWER_W),
            "GRIDSHIFT_DAEMON__POWER_SAMPLE": "0.5s",
            "GRIDSHIFT_DAEMON__CHECKPOINT_COST": "1s",  # the toy's checkpoint is instant
            "GRIDSHIFT_CANCEL_GRACE_S": "5",
        }
    )
    fixed = cli.submit(
        "--gpus", "2", "--duration", "3s", "--name", "fixed",
        "--", PY, TOY, "--epochs", "3", "--checkpoint", str(tmp_path / "fixed.json"),
    )  # fmt: skip
    elastic = cli.submit(
        "--gpus", "2-4", "--duration", "4s", "--interruptible", "--name", "elastic",
        "--", PY, TOY, "--epochs", "8", "--gpu-seconds", "2",
        "--checkpoint", str(tmp_path / "elastic.json"),
    )  # fmt: skip
    trace = tmp_path / "trace.csv"
    _flat_trace(trace, int(time.time()))
    # the elastic job starts on the 2 free GPUs: waiting 3 s for 4 ends later than running
    # on 2 meanwhile and growing to 4 when they free up (a 1 s restart)
    daemon = cli.daemon(
        "--grid", f"csv:{trace}", "--policy", "fifo", "--slot", "1s", "--interval", "0.2"
    )
    cli.wait_state(fixed, {"completed"}, timeout=40)
    done = cli.wait_state(elastic, {"completed"}, timeout=60)
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=20) == 0, daemon.stderr.read()

    runs = done["runs"]
    assert [len(r["gpu_ids"]) for r in runs] == [2, 4], "started on 2, grown to 4"
    first = cli.json("show", str(fixed))["runs"][0]
    assert _ts(runs[0]["started_at"]) < _ts(first["finished_at"]), "it ran beside the fixed job"
    assert _ts(runs[1]["started_at"]) >= _ts(first["finished_at"]), "grown once it ended"
    log = (cli.home / "logs" / f"{elastic}.log").read_text()
    assert "on 2 GPUs" in log and "on 4 GPUs" in log and "checkpointed after" in log
    resumed = log.split("on 4 GPUs")[1].split("\n")[0]
    assert "from epoch 0" not in resumed, f"resumed from its checkpoint: {resumed}"
    assert "training finished" in log

    # accounting: each run at its width (200 W a GPU), the job the sum of its runs
    for r in runs:
        seconds = _ts(r["finished_at"]) - _ts(r["started_at"])
        width = len(r["gpu_ids"])
        assert r["energy_kwh"] == pytest.approx(POWER_W * width * seconds / 3.6e6, rel=0.05)
    assert done["energy_kwh"] == pytest.approx(sum(r["energy_kwh"] for r in runs), rel=1e-6)
    assert done["carbon_g"] == pytest.approx(sum(r["carbon_g"] for r in runs), rel=1e-6)
