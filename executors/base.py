"""The executor interface: launch a command on GPUs, poll it, signal it, recover it.

Invariants (validation, logging) live once here; backends implement the ``_do_*`` parts.
"""

from __future__ import annotations

import enum
import logging
import signal as _signal
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from executors.errors import LaunchError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaunchSpec:
    """Everything an executor needs to start one attempt of one job."""

    job_id: int
    attempt_id: int
    command: list[str]
    workdir: str
    env: dict[str, str]
    gpu_indices: list[int]
    log_path: str
    run_dir: str
    run_as_uid: int | None = None  # None: run as the executor's own user
    run_as_gid: int | None = None
    log_gid: int | None = None  # unused: a log is its job's user's alone (0600)
    gpu_backend: str = "none"  # "nvml", "smi", "fake[:<power_w>[@<state>]]" or "none"
    power_sample_s: float | None = None  # energy samples in the power log (None: default)
    node: str | None = None  # which node's executor runs it (None: the local one)
    # batch schedulers (Slurm): the planned start (ISO UTC; None: now), the time limit
    # (the model's estimate plus a margin) and whether it checkpoints on SIGTERM
    begin_at: str | None = None
    time_limit_s: float | None = None
    interruptible: bool = False
    nodes: int = 1  # batch schedulers: machines a job across servers runs on (one process each)

    def to_dict(self) -> dict[str, Any]:
        """What the job monitor reads (its ``spec.json``)."""
        return asdict(self)


@dataclass(frozen=True)
class Handle:
    """Where a launched attempt can be found again, also by a restarted daemon."""

    attempt_id: int
    run_dir: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"attempt_id": self.attempt_id, "run_dir": self.run_dir, "data": self.data}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Handle:
        return cls(attempt_id=int(raw["attempt_id"]), run_dir=raw["run_dir"], data=raw["data"])


class RunStatus(enum.StrEnum):
    PENDING = "pending"  # handed to a batch scheduler, not started yet
    RUNNING = "running"
    EXITED = "exited"  # finished; exit code known
    LOST = "lost"  # vanished; exit code unknown
    UNREACHABLE = "unreachable"  # its host cannot be asked now; state unknown, not lost


@dataclass(frozen=True)
class PollResult:
    status: RunStatus
    exit_code: int | None = None  # 128 + N when killed by signal N (shell convention)
    signal: int | None = None
    ended_at: datetime | None = None
    energy_j: float | None = None  # None: not measurable here, never invented
    detail: str | None = None
    started_at: datetime | None = None  # where the backend knows it (batch schedulers)
    # LOST only: it may have run to its end (a batch scheduler forgot it): never rerun
    unknown_outcome: bool = False

    def exit_words(self) -> str:
        """How it ended, in words: ``killed by SIGTERM`` or ``exit code 1``."""
        if self.signal:
            try:
                return f"killed by {_signal.Signals(self.signal).name}"
            except ValueError:
                return f"killed by signal {self.signal}"
        return f"exit code {self.exit_code}"


class Executor(ABC):
    """Runs commands. Subclasses implement the ``_do_*`` methods."""

    name: str = "base"

    def launch(self, spec: LaunchSpec) -> Handle:
        if not spec.command:
            raise LaunchError(f"job {spec.job_id}: empty command")
        handle = self._do_launch(spec)
        log.debug("job %s attempt %s launched (%s)", spec.job_id, spec.attempt_id, self.name)
        return handle

    def poll(self, handle: Handle) -> PollResult:
        return self._do_poll(handle)

    def launch_parts(self, specs: list[LaunchSpec], run_dir: str) -> Handle:
        """Start a job across servers, one part per spec (rank order), all or none
        (``executors.gang``, behind the ``NodeRouter``)."""
        raise LaunchError("a job across servers runs on SSH servers only")

    def recover_parts(
        self, attempt_id: int, run_dir: str, nodes: list[str], interruptible: bool
    ) -> Handle | None:
        """``recover`` over an attempt's nodes (a job across servers: one per part)."""
        if len(nodes) != 1:
            raise LaunchError("a job across servers runs on SSH servers only")
        return self.recover(attempt_id, run_dir, nodes[0])

    def signal(self, handle: Handle, sig: int) -> bool:
        """Send ``sig`` to the job's process group. False when nothing was there to signal."""
        sent = self._do_signal(handle, sig)
        log.debug(
            "attempt %s: %s %s",
            handle.attempt_id,
            _signal.Signals(sig).name,
            "sent" if sent else "not sent (not running)",
        )
        return sent

    def set_power_cap(self, handle: Handle, cap_fraction: float) -> bool:
        """Cap the job's GPUs at ``cap_fraction`` of their maximum power limit (1.0 lifts
        the cap). False where this backend cannot change limits."""
        if not 0 < cap_fraction <= 1:
            raise LaunchError(f"a power cap is a fraction in (0, 1], not {cap_fraction}")
        return self._do_set_power_cap(handle, cap_fraction)

    def _do_set_power_cap(self, handle: Handle, cap_fraction: float) -> bool:
        return False

    def progress(self, handle: Handle) -> tuple[float, float | None] | None:
        """The job's own progress report (done, total), or None when it made none."""
        return self._do_progress(handle)

    def _do_progress(self, handle: Handle) -> tuple[float, float | None] | None:
        return None

    def recover(self, attempt_id: int, run_dir: str, node: str | None = None) -> Handle | None:
        """For an attempt whose launch a crash interrupted: its handle when it did start,
        None when it never will (and now cannot) start, so the job may be requeued."""
        return self._do_recover(attempt_id, run_dir, node)

    def refresh(self, handles: list[Handle]) -> None:  # noqa: B027 - optional hook
        """Ask for the state of many attempts at once, before polling them one by one
        (remote backends: one request per host, all hosts at the same time)."""

    def unreachable_nodes(self) -> dict[str, float]:
        """Nodes that cannot be reached now: name -> since when (epoch seconds)."""
        return {}

    def fence(self, handle: Handle) -> bool:
        """Make sure an attempt the daemon gave up on (its host was unreachable) is not
        running: it never starts, or it is killed. False while that cannot be done yet."""
        self.signal(handle, _signal.SIGKILL)
        return True

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads."""

    def foreign_gpus(self) -> dict[str, int]:
        """GPUs that jobs gridshift did not start hold now, per node (batch clusters
        shared with people submitting by hand)."""
        return {}

    def release(self, handle: Handle) -> None:  # noqa: B027 - optional hook
        """Let a launched attempt start once it is recorded (batch schedulers submit it
        held); nothing to do where a launch starts at once."""

    def withdraw(self, handle: Handle) -> None:  # noqa: B027 - optional hook
        """Undo a launch the daemon could not record (its lease was lost, or another
        daemon settled the attempt meanwhile). Where the claim protocol settles it (local,
        SSH: a recovering daemon either reattaches or abandoned it before its monitor
        claimed it), nothing is done."""

    def reschedule(self, handle: Handle, begin_at: datetime) -> bool:
        """Move an attempt that was handed over but has not started to a new planned
        start. False where it started already or the backend cannot."""
        return False

    @abstractmethod
    def _do_launch(self, spec: LaunchSpec) -> Handle: ...

    @abstractmethod
    def _do_poll(self, handle: Handle) -> PollResult: ...

    @abstractmethod
    def _do_signal(self, handle: Handle, sig: int) -> bool: ...

    @abstractmethod
    def _do_recover(self, attempt_id: int, run_dir: str, node: str | None) -> Handle | None: ...
