"""A pair split on the live daemon, end to end: two ``--share`` jobs on one fake GPU, the
one whose own progress reports show it at half its speed alone next to its partner (and
so past its deadline) is checkpointed, restarts alone on the free GPU from its checkpoint
and keeps its deadline; its partner is never told. Everything between the reports and the
restart is the daemon's own: the progress file, the speed tracker, the split rule, the
guard's SIGTERM, the reaper's requeue, placement alone."""

from __future__ import annotations

import sys
import time
from datetime import datetime

import pytest

from orchestrator.daemon.guard import SPLIT
from tests.conftest import E2E
from tests.helpers.waiting import wait_for

pytestmark = [E2E, pytest.mark.backends("sqlite")]

NODE = '[[nodes]]\nname = "box"\nexecutor = "local"\nfake_gpus = 2\nshare = "time-slice"\n'
FIRST, SECOND = "ResNet-18 (batch size 16)", "ResNet-18 (batch size 64)"  # no slowdown
# the job at risk: WORK seconds of work at full speed, reporting progress every 0.1 s; it
# runs at half speed while the partner's GPU (written in FLAG by the partner) is its own,
# as a job slowed by its GPU's other job would report; SIGTERM saves what is done and exits
SLOW = """import os, signal, sys, time
flag, ckpt, work = sys.argv[1], sys.argv[2], float(sys.argv[3])
gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "")
done = float(open(ckpt).read()) if os.path.exists(ckpt) else 0.0
with open(ckpt + ".runs", "a") as out:
    out.write(f"{gpu} {done:.3f}\\n")
def save(*_):
    open(ckpt, "w").write(str(done))
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
t = time.monotonic()
while done < work:
    time.sleep(0.1)
    now = time.monotonic()
    shared = os.path.exists(flag) and open(flag).read().strip() == gpu
    done = min(work, done + (now - t) * (0.5 if shared else 1.0))
    t = now
    open(os.environ["GRIDSHIFT_PROGRESS_FILE"], "w").write(f"{done:.3f} {work}")
"""
PARTNER = """import os, sys, time
open(sys.argv[1], "w").write(os.environ.get("CUDA_VISIBLE_DEVICES", ""))
time.sleep(float(sys.argv[2]))
"""
WORK_S = 8.0


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_a_job_its_partner_slows_past_its_deadline_is_split_and_restarts_alone(cli, tmp_path):
    cli.home.joinpath("gridshift.toml").write_text(NODE)
    cli.env.update({"GRIDSHIFT_FAKE_GPU_POWER_W": "200",
                    "GRIDSHIFT_DAEMON__POWER_SAMPLE": "0.2s"})  # fmt: skip
    slow, partner = tmp_path / "slow.py", tmp_path / "partner.py"
    slow.write_text(SLOW)
    partner.write_text(PARTNER)
    flag, ckpt = tmp_path / "partner.gpu", tmp_path / "slow.ckpt"
    daemon = cli.daemon("--interval", "0.2")
    try:
        # the deadline is set once the daemon serves: its start-up is not the job's slack
        wait_for(lambda: (cli.home / "gridshift.sock").exists(), what="the daemon serving")
        # 8 s of work due in 12 s: in time alone; at half speed from about 1.5 s in, 14 s
        deadline = datetime.fromtimestamp(time.time() + 12.0).astimezone().isoformat()
        a = cli.submit("--name", FIRST, "--share", "--interruptible", "--checkpoint-cost",
                       "0.2s", "--duration", f"{WORK_S:g}s", "--deadline", deadline, "--",
                       sys.executable, str(slow), str(flag), str(ckpt), str(WORK_S))  # fmt: skip
        # a rate alone first (two reports), then the partner joins its GPU (the job's row,
        # read here: a CLI process per poll costs CPU the daemon and the jobs need)
        query = f"SELECT progress_done FROM attempt WHERE job_id = {a}"
        wait_for(lambda: any((row[0] or 0) >= 0.12 * WORK_S for row in cli.db_rows(query)),
                 what="its first reports alone")  # fmt: skip
        b = cli.submit("--name", SECOND, "--share", "--duration", "30s",
                       "--", sys.executable, str(partner), str(flag), "7")  # fmt: skip
        done_a = cli.wait_state(a, {"completed", "failed"}, timeout=60)
        done_b = cli.wait_state(b, {"completed", "failed"}, timeout=60)
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    reasons = dict(cli.db_rows("SELECT job_id, group_concat(reason, ' | ') FROM event "
                               "WHERE actor = 'daemon' GROUP BY job_id"))  # fmt: skip
    assert done_a["state"] == done_b["state"] == "completed", (done_a, done_b)
    assert len(done_a["runs"]) == 2, ("split once: two attempts", done_a, reasons)
    first, second = done_a["runs"]
    (run_b,) = done_b["runs"]
    assert first["gpu_ids"] == run_b["gpu_ids"], "it was paired with the partner"
    assert second["gpu_ids"] != run_b["gpu_ids"], "it restarted alone, on the free GPU"
    assert _ts(second["started_at"]) < _ts(run_b["finished_at"]), "while the partner ran"
    runs = [line.split() for line in (tmp_path / "slow.ckpt.runs").read_text().splitlines()]
    assert len(runs) == 2 and float(runs[1][1]) > 0, "the restart went on from its checkpoint"
    assert SPLIT in reasons[a] and SPLIT not in (reasons.get(b) or ""), reasons
    assert _ts(done_a["finished_at"]) <= _ts(deadline), "alone it kept its deadline"
    for run in (first, second, run_b):
        assert run["energy_kwh"] > 0, run
