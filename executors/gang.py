"""A job across servers: one part per server, started together and stopped together.

The attempt's handle is a *gang handle*: its ``data["parts"]`` holds each part's own
handle (rank order; rank 0 runs on the node named in ``data["node"]``), each found on
its node's executor as a single-node attempt is. Each part has its own local run
directory (``<attempt run dir>/part-<rank>``), where its node's executor mirrors its run
files; on its server it runs in the attempt's usual run directory.

- Launch (``launch``): the parts start one after the other; if one cannot start, every
  part already started, and the one that failed, is fenced (killed where it runs; where
  it never started, its claim is abandoned so a late monitor never starts it), and
  ``PartsNotStarted`` says whether that worked (a server gone mid-launch cannot be fenced
  until it answers again: the daemon keeps the attempt orphaned until it is).
- State (``poll``): running while every part runs or ended well; once a part ends badly
  (non-zero exit, killed, vanished) the others get SIGTERM, then SIGKILL after
  ``STOP_GRACE_S``, and when all have ended the attempt ends as its first bad part did
  (first as this daemon saw them, never by the servers' clocks; a part it stopped is
  never blamed).
  An interruptible job whose part was killed by a signal or vanished ends ``LOST`` (its
  job is requeued and resumes from its checkpoint); otherwise the exit is the job's.
- Signals, fencing and progress go to every part (progress: rank 0's report).

A part's run files are as untrusted as any attempt's: each part is read by its node's
executor, which checks them; this module trusts no more than the ``PollResult`` it gets.
"""

from __future__ import annotations

import logging
import signal as _signal
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from executors.base import Handle, LaunchSpec, PollResult, RunStatus
from executors.errors import HostUnreachable, LaunchError

log = logging.getLogger(__name__)
STOP_GRACE_S = 10.0  # a part's SIGTERM to SIGKILL when another part ended badly
_ENDED = (RunStatus.EXITED, RunStatus.LOST)
_stop_sent: dict[int, float] = {}  # attempt -> when its parts were first told to stop
_first_bad: dict[int, list[int]] = {}  # attempt -> the ranks first seen ended badly
_heard: dict[int, set[str]] = {}  # attempt -> its parts (run dirs) that heard SIGTERM


class PartsNotStarted(LaunchError):
    """A part of a job across servers could not be started; the others were stopped.
    ``fenced``: every part is known not to run; ``handle``: the gang handle over every
    part tried (for fencing later where ``fenced`` is False)."""

    def __init__(self, message: str, handle: Handle, fenced: bool, unreachable: bool) -> None:
        super().__init__(message)
        self.handle, self.fenced, self.unreachable = handle, fenced, unreachable


def is_gang(handle: Handle | None) -> bool:
    return handle is not None and bool(handle.data.get("parts"))


def parts(handle: Handle) -> list[Handle]:
    return [Handle.from_dict(p) for p in handle.data["parts"]]


def gang_handle(
    attempt_id: int, run_dir: str, handles: list[Handle], interruptible: bool
) -> Handle:
    data = {
        "node": handles[0].data.get("node"),
        "parts": [h.to_dict() for h in handles],
        "interruptible": interruptible,
    }
    return Handle(attempt_id=attempt_id, run_dir=run_dir, data=data)


def part_handle(spec: LaunchSpec) -> Handle:
    """What is known of a part whose launch never answered: its attempt, node, run dir."""
    return Handle(spec.attempt_id, spec.run_dir, {"node": spec.node})


# -- launch -------------------------------------------------------------------------------
def launch(
    launch_one: Callable[[LaunchSpec], Handle],
    fence: Callable[[Handle], bool],
    specs: list[LaunchSpec],
    run_dir: str,
) -> Handle:
    """Start every part (``specs`` in rank order), all or none."""
    started: list[Handle] = []
    for spec in specs:
        try:
            started.append(launch_one(spec))
        except Exception as exc:
            tried = [*started, part_handle(spec)]
            fenced = _fence_all(fence, tried)
            node = spec.node or "this host"
            handle = gang_handle(spec.attempt_id, run_dir, tried, specs[0].interruptible)
            then = "every part was stopped" if fenced else "the parts are stopped once seen"
            message = f"part {len(started)} on {node} did not start ({exc}); {then}"
            unreachable = isinstance(exc, HostUnreachable)
            raise PartsNotStarted(message, handle, fenced, unreachable) from exc
    return gang_handle(specs[0].attempt_id, run_dir, started, specs[0].interruptible)


def _fence_all(fence: Callable[[Handle], bool], handles: list[Handle]) -> bool:
    done = True
    for h in handles:
        try:
            done = fence(h) and done
        except Exception as exc:  # a server that cannot be asked: fenced later
            log.warning("attempt %s: cannot stop its part on %s: %s",
                        h.attempt_id, h.data.get("node"), exc)  # fmt: skip
            done = False
    return done


def fence(fence_one: Callable[[Handle], bool], handle: Handle) -> bool:
    """Every part is known not to run (killed, or never to start)."""
    return _fence_all(fence_one, parts(handle))


# -- state --------------------------------------------------------------------------------
def poll(
    poll_one: Callable[[Handle], PollResult],
    signal_one: Callable[[Handle, int], bool],
    handle: Handle,
) -> PollResult:
    hs = parts(handle)
    results = [poll_one(h) for h in hs]
    bad = [i for i, r in enumerate(results) if r.status in _ENDED and not _ended_well(r)]
    live = [h for h, r in zip(hs, results, strict=True) if r.status is RunStatus.RUNNING]
    if bad:  # the daemon's own order, not the servers' clocks, says who failed first
        _first_bad.setdefault(handle.attempt_id, _not_stopped(results, bad))
    if bad and live:  # also while another part's server cannot be asked
        _stop(signal_one, handle.attempt_id, live)
    for rank, r in enumerate(results):
        if r.status is RunStatus.UNREACHABLE:
            return replace(r, detail=f"part {rank}: {r.detail or 'unreachable'}")
    if not bad:
        if all(r.status is RunStatus.EXITED for r in results):
            _forget(handle.attempt_id)
            ends = [r.ended_at for r in results if r.ended_at is not None]
            return PollResult(RunStatus.EXITED, exit_code=0, ended_at=max(ends, default=None))
        return PollResult(RunStatus.RUNNING)
    if any(r.status not in _ENDED for r in results):  # stopping (or pending)
        return PollResult(RunStatus.RUNNING, detail="a part ended; stopping the others")
    first = _first_bad.get(handle.attempt_id, bad)
    _forget(handle.attempt_id)
    return _outcome(hs, results, first, bool(handle.data.get("interruptible")))


def _forget(attempt_id: int) -> None:
    _stop_sent.pop(attempt_id, None)
    _first_bad.pop(attempt_id, None)
    _heard.pop(attempt_id, None)


def _not_stopped(results: list[PollResult], bad: list[int]) -> list[int]:
    """Which of the parts first seen ended badly to blame (several at once: this daemon
    restarted, or polled late): those not ended by the signals that stop parts, if any."""
    stops = (_signal.SIGTERM, _signal.SIGKILL)

    def stopped(r: PollResult) -> bool:
        return r.signal in stops or r.exit_code in (128 + stops[0], 128 + stops[1])

    return [i for i in bad if not stopped(results[i])] or bad


def _ended_well(r: PollResult) -> bool:
    return r.status is RunStatus.EXITED and r.exit_code == 0


def _stop(signal_one: Callable[[Handle, int], bool], attempt_id: int, live: list[Handle]) -> None:
    """SIGTERM to the parts still running, once each part heard it (one whose job had
    not started yet is told again); SIGKILL at each poll after the grace."""
    now = time.monotonic()
    first = _stop_sent.setdefault(attempt_id, now)
    heard = _heard.setdefault(attempt_id, set())
    sig = _signal.SIGKILL if now - first >= STOP_GRACE_S else _signal.SIGTERM
    for h in live:
        if sig == _signal.SIGTERM and h.run_dir in heard:
            continue
        try:
            if signal_one(h, sig):
                heard.add(h.run_dir)
        except Exception as exc:  # retried at the next poll
            log.warning("attempt %s: cannot stop its part on %s: %s",
                        attempt_id, h.data.get("node"), exc)  # fmt: skip


def _outcome(
    hs: list[Handle], results: list[PollResult], bad: list[int], interruptible: bool
) -> PollResult:
    """The attempt ends as its first bad part did: among the parts this daemon saw end
    badly first (``bad``), by their end time, then rank."""
    far = datetime.max.replace(tzinfo=None)

    def end_key(i: int) -> tuple:
        at = results[i].ended_at
        return (at.replace(tzinfo=None) if at is not None else far, i)

    first = min(bad, key=end_key)
    r = results[first]
    node = hs[first].data.get("node")
    why = r.detail or r.exit_words()
    detail = f"part {first} on {node}: {why}; the other parts were stopped"
    ends = [x.ended_at for x in results if x.ended_at is not None]
    ended_at = max(ends, default=None)
    killed = r.signal is not None or (r.exit_code is not None and r.exit_code > 128)
    if r.status is RunStatus.LOST or (interruptible and killed):
        return PollResult(RunStatus.LOST, ended_at=ended_at, detail=detail)
    return PollResult(RunStatus.EXITED, exit_code=r.exit_code, signal=r.signal,
                      ended_at=ended_at, detail=detail)  # fmt: skip


def signal(signal_one: Callable[[Handle, int], bool], handle: Handle, sig: int) -> bool:
    """``sig`` to every part; True when some part heard it. Raises the first error only
    when no part could be signalled."""
    sent, errors = False, []
    for h in parts(handle):
        try:
            sent = signal_one(h, sig) or sent
        except Exception as exc:
            errors.append(exc)
    if errors and not sent:
        raise errors[0]
    return sent


def recover(
    recover_one: Callable[[int, str, str | None], Handle | None],
    fence_one: Callable[[Handle], bool],
    attempt_id: int,
    run_dir: str,
    nodes: list[str],
    interruptible: bool,
) -> Handle | None:
    """An attempt whose launch a crash interrupted: its gang handle when every part
    started; else every part is fenced and None (the job may be requeued). Raises
    HostUnreachable while a part's server cannot be asked (nothing is fenced then)."""
    found = [recover_one(attempt_id, part_dir(run_dir, rank), node)
             for rank, node in enumerate(nodes)]  # fmt: skip
    if all(h is not None for h in found):
        return gang_handle(attempt_id, run_dir, found, interruptible)
    tried = [h or Handle(attempt_id, part_dir(run_dir, r), {"node": n})
             for r, (h, n) in enumerate(zip(found, nodes, strict=True))]  # fmt: skip
    if not _fence_all(fence_one, tried):
        raise HostUnreachable(f"attempt {attempt_id}: a part cannot be stopped yet")
    return None


def bare_handle(attempt_id: int, run_dir: str, nodes: list[str]) -> Handle:
    """What is known of an attempt whose launch never answered: its id, run directory
    and node(s) (a job across servers: each part's)."""
    if len(nodes) == 1:
        return Handle(attempt_id, run_dir, {"node": nodes[0]})
    hs = [Handle(attempt_id, part_dir(run_dir, r), {"node": n}) for r, n in enumerate(nodes)]
    return gang_handle(attempt_id, run_dir, hs, interruptible=False)


def part_dir(run_dir: str, rank: int) -> str:
    return f"{run_dir}/part-{rank}"
