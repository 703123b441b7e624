"""The one pass: the live daemon (the SQL store, on a real SQLite file) and the what-if
simulator (arrays) make the same decisions, pass by pass, on the same queue, signal and
cluster: which job starts when, on how many GPUs, at what power cap, and which jobs are
suspended when. Both run on simulated time: the daemon's clock is an event loop and its
executor the simulated one, woken when its ``tick`` says something is due next."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import numpy as np
import pytest

from executors.simulated import SimulatedExecutor, Workload
from orchestrator.planning.policies import resolve_policy
from orchestrator.planning.policies.base import Decision
from orchestrator.planning.policies.baselines import Fifo
from orchestrator.sim.events import EventLoop

GPUS = 8
GRID = "synthetic:days=5&start=2023-03-01"


def _rows() -> list[dict]:
    """Eight 6-hour 1-GPU jobs fill the node, each with some slack to its deadline; a
    4-GPU job arrives that must start within the hour to meet its deadline, so the guard
    makes room for it, from jobs that keep enough slack: on GPUs 0-3 (the first job keeps
    45 min) or on GPUs 4-7 (the first keeps 200 min). Then a 2-GPU job and an 8-GPU one."""
    t0 = "2023-03-01T00:00:00"
    rows = []
    for slack_m in (45, 120, 150, 100, 200, 300, 400, 600):
        rows.append({"submit": t0, "duration": "6h", "gpus": 1, "interruptible": True,
                     "within": f"{360 + slack_m}m"})  # fmt: skip
    rows.append({"submit": "2023-03-01T00:20:00", "duration": "2h", "gpus": 4, "within": "2h50m"})
    rows.append({"submit": "2023-03-01T00:40:00", "duration": "1h", "gpus": 2, "within": "10h"})
    rows.append({"submit": "2023-03-01T01:05:00", "duration": "30m", "gpus": 8, "within": "20h",
                 "interruptible": True})  # fmt: skip
    return rows


class _Capped(Fifo):
    """fifo at a power cap that depends on the job (its width), so that caps differ."""

    name = "capped-fifo"

    def plan(self, snapshot):
        return {
            job.id: Decision(snapshot.now_s, cap={1: 0.8, 2: 0.6, 4: 0.9}.get(job.gpus, 1.0))
            for job in snapshot.jobs
        }


def _policy(name: str):
    return _Capped() if name == "capped-fifo" else resolve_policy(name)


def _inputs(tmp_path, slot: str):
    from orchestrator.sim.inputs import prepare
    from orchestrator.sim.scenario import Scenario

    trace = tmp_path / "jobs.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    scenario = Scenario.model_validate(
        {
            "policies": ["fifo"],
            # a resumed attempt's lost run time is the replay's model of a real job (the
            # live side runs fake jobs that lose nothing): the decisions are compared
            "jobs": {"source": str(trace), "checkpoint_cost": "0"},
            "grid": {"source": GRID},
            "cluster": {"gpus": GPUS, "gpus_per_node": GPUS},
            "slot": slot,
        }
    )
    return prepare(scenario, tmp_path)


def _simulate(inputs, policy: str) -> list[tuple]:
    """The simulator's decisions: (time, what, job index, GPUs, cap)."""
    from orchestrator.sim.engine import SimDaemon
    from orchestrator.sim.runner import make_forecaster

    sim = SimDaemon(inputs, _policy(policy), make_forecaster("perfect", inputs, 0))
    out: list[tuple] = []
    launch, requeue = sim.launch, sim._requeue

    def launched(job, decision, allocation, now):
        launch(job, decision, allocation, now)
        att = sim._running[sim._attempt_id]
        cap = sim.executor.cap_of(att.handle)[0]
        out.append((now, "start", job.id, att.gpus, round(cap, 6)))

    def requeued(att, now):
        out.append((now, "suspend", att.job.id, att.gpus, None))
        requeue(att, now)

    sim.launch, sim._requeue = launched, requeued  # the pass calls them on its state
    sim.run()
    # the database keeps microseconds: times agree to the millisecond
    return sorted(((round(e[0], 3), *e[1:]) for e in out), key=lambda e: (e[0], e[1], e[2]))


class _LoopClock:
    def __init__(self, loop: EventLoop) -> None:
        self.loop = loop

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.loop.now, UTC)

    def sleep(self, seconds, wake) -> None:  # never: the loop jumps
        raise AssertionError("a simulated clock does not sleep")


class _LiveSimExecutor(SimulatedExecutor):
    """The simulated executor behind the daemon: each launch runs the job's model at the
    width and the cap the daemon gave its attempt, from the work it had done."""

    def __init__(self, loop, models, db) -> None:
        super().__init__(loop)
        self.models, self.db, self.done = models, db, {}

    def _do_launch(self, spec):
        from orchestrator.queue.models import Attempt

        with self.db.read() as session:
            cap = session.get(Attempt, spec.attempt_id).cap or 1.0
        model, width = self.models[spec.job_id - 1], max(1, len(spec.gpu_indices))
        self.prepare(
            spec.attempt_id,
            Workload(1.0, lambda f: model.throughput(width, f),
                     lambda f: model.power_w(width, f), self.done.get(spec.job_id, 0.0), cap),
        )  # fmt: skip
        handle = super()._do_launch(spec)
        self._job = getattr(self, "_job", {})
        self._job[spec.attempt_id] = spec.job_id
        return handle

    def _end(self, handle, run, exit_code, detail):
        super()._end(handle, run, exit_code, detail)
        self.done[self._job[handle.attempt_id]] = run.load.done


def _live(tmp_path, inputs, policy: str, slot: str) -> list[tuple]:
    """The daemon's decisions on the same jobs, read back from its database."""
    from sqlmodel import select

    from orchestrator.daemon.service import Daemon
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Attempt
    from orchestrator.queue.ownership import current_user
    from orchestrator.queue.spec import JobSpec
    from orchestrator.queue.store import submit
    from orchestrator.settings import Settings
    from orchestrator.sim.engine import SimDaemon

    home = tmp_path / "home"
    settings = Settings(
        home=home, fake_gpus=GPUS,
        daemon={"policy": "fifo", "grid": [GRID], "slot": slot},
    )  # fmt: skip
    db = Database(settings.db_url)
    db.ensure_schema()
    loop = EventLoop(float(inputs.jobs.submit_s[0]))
    models = [
        SimDaemon(inputs, resolve_policy("fifo"), None)._model(i) for i in range(len(_rows()))
    ]
    executor = _LiveSimExecutor(loop, models, db)
    daemon = Daemon(settings=settings, db=db, executor=executor, clock=_LoopClock(loop))
    assert daemon.dispatcher.executor is executor and daemon.caps.enabled
    daemon.planner.policy = _policy(policy)
    user = current_user()
    jobs = inputs.jobs
    for i in range(len(jobs.submit_s)):
        at = float(jobs.submit_s[i])
        deadline = inputs.deadline_s[i]
        spec = JobSpec(
            command=["true"], workdir=str(tmp_path), gpus_min=int(jobs.gpus[i]),
            gpus_max=int(jobs.gpus[i]), duration_s=float(jobs.duration_s[i]),
            deadline=None if np.isnan(deadline) else datetime.fromtimestamp(deadline, UTC),
            interruptible=bool(inputs.interruptible[i]),
        )  # fmt: skip

        def arrive(spec=spec, at=at):
            submit(db, [spec], user=user, now=datetime.fromtimestamp(at, UTC),
                   largest_node_gpus=GPUS)  # fmt: skip

        loop.schedule(at, arrive, priority=0)
    wakes: set[float] = set()

    def tick(now_s: float) -> None:
        left = daemon.tick(datetime.fromtimestamp(now_s, UTC))
        at = now_s + left
        if left < daemon.interval_s and at not in wakes:  # something due before the interval
            wakes.add(at)
            loop.schedule(at)

    daemon.interval_s = 1e9  # only what is due wakes it, as the simulator
    loop.run(after=tick)
    out: list[tuple] = []
    with db.read() as session:
        for att in session.exec(select(Attempt).order_by(Attempt.id)).all():
            start = att.started_at.timestamp()
            out.append((start, "start", att.job_id - 1, len(att.gpu_ids), round(att.cap or 1.0, 6)))
            if att.suspend_sent_at is not None:
                out.append((att.suspend_sent_at.timestamp(), "suspend", att.job_id - 1,
                            len(att.gpu_ids), None))  # fmt: skip
            assert att.state == "exited", att
    # the database keeps microseconds: times agree to the millisecond
    return sorted(((round(e[0], 3), *e[1:]) for e in out), key=lambda e: (e[0], e[1], e[2]))


# the jobs the guard suspends (to start the urgent job, then for those it moved): at least
# 4 slots of slack, so 20 min at 5-minute slots, 1 h at 15-minute ones, none at 1-hour ones
MOVED = {"5m": {0, 1, 2, 3, 4, 5}, "15m": {1, 2, 3, 4, 5, 6, 7}, "1h": set()}


@pytest.mark.parametrize("slot", ["15m", "5m", "1h"])
@pytest.mark.parametrize("policy", ["fifo", "capped-fifo"])
def test_the_daemon_and_the_simulator_decide_alike(tmp_path, policy, slot):
    inputs = _inputs(tmp_path, slot)
    sim = _simulate(inputs, policy)
    live = _live(tmp_path, inputs, policy, slot)
    assert {e[2] for e in sim if e[1] == "suspend"} == MOVED[slot]
    assert live == sim


@pytest.mark.parametrize("slot", ["5m", "1h"])
def test_an_old_slack_rule_on_one_side_is_caught(tmp_path, monkeypatch, slot):
    """The comparison can fail: the simulator's old rule (an hour of slack, whatever the
    slot) on the simulator's side only moves other jobs than the daemon does."""
    from orchestrator.planning import onepass

    inputs = _inputs(tmp_path, slot)
    live = _live(tmp_path, inputs, "fifo", slot)
    rule = onepass.may_make_room

    def old(job, remaining_s, now_s, slot_s, max_defer_s):
        return rule(job, remaining_s, now_s, 3600.0 / onepass.GUARD_SLACK_SLOTS, max_defer_s)

    monkeypatch.setattr(onepass, "may_make_room", old)
    assert _simulate(inputs, "fifo") != live
