"""What a hostile review of pueue's verbs found, each pinned: ``logs -n`` splits lines
on ``\\n`` only and reads back at most ``TAIL_MAX`` bytes; ``wait`` names at most ten
missing ids; a table never prints a negative zero."""

from __future__ import annotations

import base64
import io

import pytest
from sqlmodel import select

from orchestrator.cli import logs
from orchestrator.cli.output.tables import num

BLOCK = 64 << 10


class _Log:
    """A log the daemon serves in blocks, counting the bytes it hands out."""

    def __init__(self, data: bytes, sized: bool = True):
        self.data, self.sized, self.served = data, sized, 0

    def read(self, offset: int) -> dict:
        block = self.data[offset : offset + BLOCK]
        self.served += len(block)
        size = len(self.data) if self.sized else None
        return {"state": "completed", "sources": 1, "data": base64.b64encode(block).decode(),
                "size": size}  # fmt: skip

    def tail(self, lines: int) -> bytes:
        out = io.BytesIO()
        assert logs._tail(self.read, self.read(0), lines, out) == len(self.data)
        return out.getvalue()


@pytest.mark.parametrize("sized", [True, False])
def test_logs_tail_ends_lines_at_newline_only(sized):
    bars = b"".join(b"\r%3d%%|####" % i for i in range(100))
    log = _Log(b"epoch 1\nepoch 2\n" + bars + b"\n" + bars, sized)
    assert log.tail(3) == b"epoch 2\n" + bars + b"\n" + bars
    assert log.tail(1) == bars


@pytest.mark.parametrize("sized", [True, False])
def test_logs_tail_keeps_at_most_a_mebibyte(sized):
    log = _Log(b"x" * (24 << 20) + b"y" * logs.TAIL_MAX, sized)  # no line break at all
    assert log.tail(1) == b"y" * logs.TAIL_MAX
    if sized:  # only the end is read (windows of 64 KiB, 512 KiB, 1 MiB)
        assert log.served <= 2 * logs.TAIL_MAX
    long_lines = _Log(b"a\n" + b"z" * (3 << 20) + b"\nlast", sized)
    assert long_lines.tail(2) == (b"z" * (3 << 20) + b"\nlast")[-logs.TAIL_MAX :]
    assert long_lines.tail(1) == b"last"


def test_num_never_prints_a_negative_zero():
    assert num(-0.0004, 0, "%") == "0%"
    assert num(-0.0004, 3) == "0.000"
    assert num(-0.0) == "0.0"
    assert num(-0.6, 0, "%") == "-1%"
    assert num(-0.05, 3) == "-0.050"


def test_wait_names_at_most_ten_missing_ids():
    from orchestrator.cli.verbs.wait import _some

    assert _some(list(range(1, 40001))) == "1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 39990 more"
    assert _some([3, 4]) == "3, 4"


def test_a_daemon_reaping_an_end_cancel_recorded_meanwhile_changes_nothing(tmp_path):
    """``cancel`` with no daemon recorded the end (carbon kept) between a starting
    daemon's look at its live attempts and its poll: the daemon's record is skipped."""
    import os
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from executors.base import PollResult, RunStatus
    from orchestrator.accounting.meter import Accountant
    from orchestrator.daemon.reaper import Reaper
    from orchestrator.queue import attempts
    from orchestrator.queue.attempts import AttemptState
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Attempt, Job, Usage

    now = datetime(2026, 11, 24, 1, 0, tzinfo=UTC)
    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    with db.write() as session:
        job = Job(state="cancelled", user="u", uid=os.getuid(), command=["true"], workdir="/",
                  gpus_min=1, gpus_max=1, submitted_at=now, attempts=1, carbon_g=5.0,
                  reason="cancelled by request; carbon counted up to ...")  # fmt: skip
        session.add(job)
        session.flush()
        att = attempts.begin(session, at=now, job_id=job.id, number=1, node="local",
                             gpu_ids=[0], run_dir=str(tmp_path / "run"))  # fmt: skip
        attempts.move(
            session,
            att,
            AttemptState.RUNNING,
            at=now,
            handle={"attempt_id": att.id, "run_dir": "", "data": {}},
        )
        stale = Attempt.model_validate(att.model_dump())  # the daemon's look: running
        attempts.move(session, att, AttemptState.EXITED, at=now, finished_at=now,
                      exit_code=143, carbon_g=5.0, energy_j=100.0)  # fmt: skip
        session.add(Usage(attempt_id=att.id, day=now.replace(hour=0), job_id=job.id,
                          energy_j=100.0, carbon_g=5.0))  # fmt: skip
    executor = SimpleNamespace(
        poll=lambda handle: PollResult(RunStatus.EXITED, exit_code=143, ended_at=now),
        progress=lambda handle: None,
    )
    accountant = Accountant(carbon=lambda a, b: 0.0, price=lambda a, b: None,
                            modelled_power_w=lambda att: 300.0)  # fmt: skip
    reaper = Reaper(db=db, executor=executor, settings=SimpleNamespace(cancel_grace_s=1.0),
                    nodes=[], accountant=accountant)  # fmt: skip
    assert reaper._reap_one(stale, now) == 1
    with db.read() as session:
        att, job = session.get(Attempt, stale.id), session.get(Job, stale.job_id)
        usage = session.exec(select(Usage)).all()
        assert (att.state, att.carbon_g, att.energy_j) == ("exited", 5.0, 100.0)
        assert (job.state, job.carbon_g) == ("cancelled", 5.0)
        assert "carbon counted up to" in job.reason
        assert [(u.energy_j, u.carbon_g) for u in usage] == [(100.0, 5.0)]


@pytest.mark.parametrize(
    "edit",
    [
        {"gpus_min": 4, "gpus_max": 4},
        {"duration_s": 7200.0},
        {"deadline": "later"},
        {"gpu_type": "p100"},
    ],
)
def test_a_launch_refuses_a_job_edited_since_the_pass_planned_it(tmp_path, edit):
    """``edit --gpus 4`` (or a new run time, deadline or GPU type) landing between a pass's plan
    and its launch: not launched on the planned GPUs; planned again at the next pass."""
    import os
    from datetime import UTC, datetime, timedelta
    from types import SimpleNamespace

    from orchestrator.daemon.dispatch import Dispatcher
    from orchestrator.nodes.inventory import ResolvedNode
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Attempt, Job
    from orchestrator.queue.ownership import current_user
    from orchestrator.settings import NodeConfig, Settings

    now = datetime(2026, 11, 24, 1, 0, tzinfo=UTC)
    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    with db.write() as session:
        job = Job(state="queued", user="u", uid=os.getuid(), command=["true"],
                  workdir=str(tmp_path), gpus_min=1, gpus_max=1, submitted_at=now,
                  duration_s=3600.0, deadline=now + timedelta(hours=5))  # fmt: skip
        session.add(job)
        session.flush()
        session.expunge(job)  # the pass's view
    with db.write() as session:  # edit, meanwhile
        row = session.get(Job, job.id)
        for field, value in edit.items():
            setattr(row, field, now + timedelta(hours=9) if value == "later" else value)
        session.add(row)

    def launch(spec):
        raise AssertionError("launched on the old plan")

    node = ResolvedNode("local", "local", (), "config",
                        config=NodeConfig(name="local", executor="local", gpus=4))  # fmt: skip
    d = Dispatcher(settings=Settings(home=tmp_path / "home"), db=db,
                   executor=SimpleNamespace(launch=launch), nodes=[node],
                   user=current_user())  # fmt: skip
    assert d.launch(job, "local", [0], now) is False
    with db.read() as session:
        assert session.exec(select(Attempt)).all() == []
        row = session.get(Job, job.id)
        assert (row.state, row.attempts) == ("queued", 0)
