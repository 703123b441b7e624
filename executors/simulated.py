"""A simulated executor for what-if runs: no processes, only modelled work and power on a
simulated timeline.

Before ``launch``, the simulator ``prepare``s each attempt with a ``Workload``: its total
work, the work already done (a resumed job), and its speed and power draw as functions of
the power-cap fraction (from the performance model). The attempt completes when its work
is done; the executor schedules that moment on the timeline and moves it whenever the job
is paused, resumed or re-capped:

- SIGSTOP / SIGTSTP pause it (no progress, no power: as ``--suspend stop``, GPUs held);
- SIGCONT resumes it;
- SIGTERM checkpoints it and ends the attempt (exit 0, ``detail="checkpointed"``); its
  progress says how much work remains for the next attempt;
- SIGKILL ends it (exit 137);
- ``set_power_cap`` changes speed and draw from that moment on;
- ``rescale`` multiplies its speed, draw and GPU count by factors from that moment on (a
  job sharing its GPU with another: ``orchestrator.sim.hardware.colocation``).
Every stretch of constant power is recorded in ``segments`` (start, end, watts) for the
energy and carbon accounts.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from executors.base import Executor, Handle, LaunchSpec, PollResult, RunStatus
from executors.errors import LaunchError


class Timeline(Protocol):
    now: float

    def schedule(self, at: float, action: Callable[[], None]) -> object: ...

    def cancel(self, event: object) -> None: ...


@dataclass
class Workload:
    work: float  # total work units
    rate: Callable[[float], float]  # work units per second at a cap fraction
    power_w: Callable[[float], float]  # draw at a cap fraction, watts
    done: float = 0.0  # work already done (a resumed job)
    cap_fraction: float = 1.0


@dataclass
class _Run:
    load: Workload
    since: float
    rate: float
    power_w: float
    gpus: float = 0
    paused: bool = False
    factors: tuple[float, float, float] = (1.0, 1.0, 1.0)  # speed, draw, GPUs (rescale)
    event: object | None = None
    energy_j: float = 0.0
    ended_at: float | None = None
    exit_code: int | None = None
    detail: str | None = None


class SimulatedExecutor(Executor):
    name = "simulated"

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self._prepared: dict[int, Workload] = {}
        self._runs: dict[int, _Run] = {}
        self._ended: list[Handle] = []
        self.seg_start: list[float] = []
        self.seg_end: list[float] = []
        self.seg_power_w: list[float] = []
        self.seg_gpus: list[int] = []

    def prepare(self, attempt_id: int, workload: Workload) -> None:
        self._prepared[attempt_id] = workload

    def drain_ended(self) -> list[Handle]:
        """Attempts that ended since the last call (so the simulator never polls all)."""
        ended, self._ended = self._ended, []
        return ended

    # -- Executor -----------------------------------------------------------------------
    def _do_launch(self, spec: LaunchSpec) -> Handle:
        load = self._prepared.pop(spec.attempt_id, None)
        if load is None:
            raise LaunchError(f"attempt {spec.attempt_id}: no workload prepared")
        f = load.cap_fraction
        run = _Run(load, self.timeline.now, load.rate(f), load.power_w(f), len(spec.gpu_indices))
        self._runs[spec.attempt_id] = run
        handle = Handle(spec.attempt_id, spec.run_dir)
        self._schedule_end(handle, run)
        return handle

    def _do_poll(self, handle: Handle) -> PollResult:
        run = self._runs.get(handle.attempt_id)
        if run is None:
            return PollResult(RunStatus.LOST, detail="unknown to the simulator")
        if run.ended_at is None:
            return PollResult(RunStatus.RUNNING)
        return PollResult(
            RunStatus.EXITED,
            exit_code=run.exit_code,
            ended_at=datetime.fromtimestamp(run.ended_at, UTC),
            energy_j=run.energy_j,
            detail=run.detail,
        )

    def _do_signal(self, handle: Handle, sig: int) -> bool:
        run = self._runs.get(handle.attempt_id)
        if run is None or run.ended_at is not None:
            return False
        if sig in (_signal.SIGSTOP, _signal.SIGTSTP):
            if not run.paused:
                self._advance(run)
                run.paused = True
                self._cancel_end(run)
        elif sig == _signal.SIGCONT:
            if run.paused:
                run.since, run.paused = self.timeline.now, False
                self._schedule_end(handle, run)
        elif sig in (_signal.SIGTERM, _signal.SIGINT):
            self._end(handle, run, 0, "checkpointed")
        elif sig == _signal.SIGKILL:
            self._end(handle, run, 128 + sig, None)
        return True

    def _do_set_power_cap(self, handle: Handle, cap_fraction: float) -> bool:
        run = self._runs.get(handle.attempt_id)
        if run is None or run.ended_at is not None:
            return False
        self._advance(run)
        run.load.cap_fraction = cap_fraction
        self._apply(run)
        if not run.paused:
            self._cancel_end(run)
            self._schedule_end(handle, run)
        return True

    def rescale(self, handle: Handle, speed: float, power: float, gpus: float = 1.0) -> bool:
        """From now on the attempt runs at ``speed`` times its modelled speed, draws
        ``power`` times its modelled draw and counts ``gpus`` times its GPUs (1, 1, 1: as
        modelled). False when it has ended."""
        run = self._runs.get(handle.attempt_id)
        if run is None or run.ended_at is not None or speed <= 0:
            return False
        self._advance(run)
        run.gpus = run.gpus / run.factors[2] * gpus
        run.factors = (speed, power, gpus)
        self._apply(run)
        if not run.paused:
            self._cancel_end(run)
            self._schedule_end(handle, run)
        return True

    def remaining_s(self, handle: Handle) -> float | None:
        """Seconds of work an attempt has left at its speed now (None: ended or unknown)."""
        run = self._runs.get(handle.attempt_id)
        done = self.done_now(handle)
        if run is None or run.ended_at is not None or done is None:
            return None
        return max(0.0, run.load.work - done) / run.rate

    def _apply(self, run: _Run) -> None:
        f, (speed, power, _) = run.load.cap_fraction, run.factors
        run.rate, run.power_w = run.load.rate(f) * speed, run.load.power_w(f) * power

    def _do_progress(self, handle: Handle) -> tuple[float, float | None] | None:
        run = self._runs.get(handle.attempt_id)
        if run is None:
            return None
        if run.ended_at is None:
            self._advance(run)
        return run.load.done, run.load.work

    def done_now(self, handle: Handle) -> float | None:
        """The work an attempt has done by now, as ``progress`` says, without closing its
        power stretch (the resize step asks on every pass)."""
        run = self._runs.get(handle.attempt_id)
        if run is None:
            return None
        if run.ended_at is not None or run.paused:
            return run.load.done
        return min(run.load.work, run.load.done + run.rate * (self.timeline.now - run.since))

    def _do_recover(self, attempt_id: int, run_dir: str, node: str | None) -> Handle | None:
        run = self._runs.get(attempt_id)
        return Handle(attempt_id, run_dir) if run is not None else None

    # -- internals ----------------------------------------------------------------------
    def _advance(self, run: _Run) -> None:
        """Account the work and energy of the stretch since ``run.since``."""
        now = self.timeline.now
        if not run.paused and now > run.since:
            span = now - run.since
            run.load.done = min(run.load.work, run.load.done + run.rate * span)
            run.energy_j += run.power_w * span
            self.seg_start.append(run.since)
            self.seg_end.append(now)
            self.seg_power_w.append(run.power_w)
            self.seg_gpus.append(run.gpus)
        run.since = now

    def _schedule_end(self, handle: Handle, run: _Run) -> None:
        remaining = max(0.0, run.load.work - run.load.done)
        at = self.timeline.now + remaining / run.rate
        run.event = self.timeline.schedule(at, lambda: self._end(handle, run, 0, None))

    def _cancel_end(self, run: _Run) -> None:
        if run.event is not None:
            self.timeline.cancel(run.event)
            run.event = None

    def _end(self, handle: Handle, run: _Run, exit_code: int, detail: str | None) -> None:
        self._advance(run)
        self._cancel_end(run)
        if exit_code == 0 and detail is None:
            run.load.done = run.load.work  # completed: no rounding left over
        run.ended_at, run.exit_code, run.detail = self.timeline.now, exit_code, detail
        self._ended.append(handle)

    def cap_of(self, handle: Handle) -> tuple[float, float] | None:
        """(cap fraction, watts) an attempt runs at now; None when unknown or ended."""
        run = self._runs.get(handle.attempt_id)
        if run is None or run.ended_at is not None:
            return None
        return run.load.cap_fraction, run.power_w

    def forget(self, attempt_id: int) -> None:
        """Drop an ended attempt's state (the simulator has recorded it)."""
        self._runs.pop(attempt_id, None)
