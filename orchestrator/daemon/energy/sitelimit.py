"""The site power limit on the live cluster (``daemon --power-limit 15kW``).

What counts: the power limit in force on every GPU of every configured node, whether a
job runs on it or not. Idle GPUs are parked at their lowest limit (a GPU at rest draws
its idle power whatever its limit; the limit only bounds what a job may make it draw), so
the sum of the limits bounds what the GPUs can draw at any moment. Every node with GPUs
must let the daemon set their limits (else it refuses to start, as it does when the
GPUs' lowest limits alone add up to more than the limit); the hosts' own draw, PUE and
GPUs nobody configured are not counted. A server that does not answer (at start or
later) has its GPUs counted at their highest limit, neither read nor set, and blocks no
admission elsewhere; when it answers again, the next split lowers its limits (back at
their defaults after a reboot) before any job starts there.

With right-sizing (``daemon.energy.rightsizing`` says how to count each server): one off
counts 0 W (stored off but answering at start: on); one powering off its limits last read
(unreachable: its highest); one waking or whose wake failed its GPUs' highest (their
default after a boot) until it answers. A server off or down at start has its GPUs' range
as discovery stored it (``nodes.sitestore``). A wake is an admission (``wakes``): the split
with that server at its highest must fit, what it lowers lowered before power_on; else it
stays off and its job waits, saying why. A limit that could never wake a right-sized
server (the others off, the servers not right-sized at their lowest) is refused at start.

How it holds: a stopped job (SIGSTOP) counts as idle, its GPUs parked at their lowest; its
resume is an admission. A job starts only when the split (``planning.policies.powersplit``) of the
limit over the jobs that hold GPUs and it fits; its admission lowers the others' limits
first, and its own GPUs are raised from their parked lowest only then, before its process
starts. After every pass the limit is split again (an end frees power for the others):
every decrease is made before any increase, and no increase is made while a decrease
failed (a server that did not answer), so the sum stays under the limit during every
transition too. A job that does not fit even with every job at its lowest limit waits.

The gradient: each job's progress at each cap it ran under, from its progress reports
(``GRIDSHIFT_PROGRESS_FILE``) between passes at one cap, measured per watt of limit; a
job measured at two caps or more is split by what it measured, else by its GPU type's
model (the Zeus fit). What a job writes is untrusted: a measured gradient moves a job at
most 10 % of its GPUs' maximum limits below its share of the model's split
(``powersplit.split_fair``). Measurements live in memory: a restarted daemon learns them again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sqlmodel import col, select

from orchestrator.daemon.energy.rightsizing import MAY_BE_ON, POWERING_OFF
from orchestrator.errors import ConfigError
from orchestrator.nodes.inventory import ResolvedNode
from orchestrator.nodes.powercaps import ClusterCaps, PowerCaps
from orchestrator.nodes.sitestore import range_of, still_waiting, stored_power, stored_ranges
from orchestrator.planning.devices.rightsizing import OFF, ON
from orchestrator.planning.perfmodel import curve_for
from orchestrator.planning.policies.powersplit import PowerJob, measured_progress, split_fair
from orchestrator.queue import attempts
from orchestrator.queue.attempts import AttemptState
from orchestrator.queue.db import Database
from orchestrator.queue.models import Attempt

log = logging.getLogger(__name__)
GpuKey = tuple[int, int]  # (id of the node's PowerCaps, GPU index): local nodes share one


@dataclass
class _Gpu:
    caps: PowerCaps
    index: int
    low_w: float
    high_w: float

    def watts(self, f: float) -> float:
        return min(self.high_w, max(self.low_w, f * self.high_w))


@dataclass
class _Job:
    """A job that holds (or is about to hold) GPUs, as the split sees it."""

    key: object  # ("attempt", id) or ("job", id) while admitted and not started yet
    node: str
    gpus: list[GpuKey]
    model: str | None
    highest: float  # its plan's cap
    samples: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class SiteLimit:
    limit_w: float
    caps: ClusterCaps
    nodes: list[ResolvedNode]
    db: Database
    gpus: dict[GpuKey, _Gpu] = field(default_factory=dict)
    pending: dict[int, _Job] = field(default_factory=dict)  # job id -> admitted, not started
    targets: dict[GpuKey, float] = field(default_factory=dict)  # the last split, watts
    fraction: dict[int, float] = field(default_factory=dict)  # attempt id -> cap in force
    samples: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    seen: dict[int, tuple[float, float, float]] = field(default_factory=dict)
    unreachable: Callable[[], dict] = dict  # the executor's unreachable nodes (name -> since)
    down: set[int] = field(default_factory=set)  # PowerCaps ids that did not answer
    refused: dict[int, str] = field(default_factory=dict)  # job id -> why it waits for power
    power: Callable[[str], str] = lambda _n: ON  # right-sizing's count (RightSizer.counted)
    off: set[int] = field(default_factory=set)  # PowerCaps ids of servers off: 0 W
    parking: set[int] = field(default_factory=set)  # servers powering off: limits last read
    last: dict[GpuKey, float] = field(default_factory=dict)  # the limit last read on a GPU
    answered: set[str] = field(default_factory=set)  # stored off, but their GPUs answer: on

    # -- start ----------------------------------------------------------------------------
    def check(self) -> None:
        """Check that the limit can hold (ConfigError, one line, otherwise); from now on a
        GPU its job left goes to its lowest limit. ``rebalance`` then parks the idle GPUs
        and splits the limit over the running jobs (once this daemon serves the queue)."""
        stored = self._stored_power()
        ranges = self._stored_ranges()
        for node in self.nodes:
            if not node.gpu_count:
                continue
            caps = self.caps.by_node.get(node.name)
            if caps is not None and stored.get(node.name) == OFF and not caps.enabled:
                self._budget_down(node, caps, self.off, ranges, node.name in stored)  # 0 W
                continue
            if caps is not None and stored.get(node.name) == OFF:
                self.answered.add(node.name)  # stored off, but it answers: on (right-sizing too)
            if caps is not None and not caps.enabled and self._is_down(node.name, caps):
                self._budget_down(node, caps, self.down, ranges, node.name in stored)
                continue
            if caps is None or not caps.enabled:
                why = caps.reason if caps is not None else f"a {node.executor} node"
                raise ConfigError(
                    f"invalid --power-limit: node {node.name}'s GPU power limits cannot be "
                    f"set ({why}), so a site limit cannot hold"
                )
            for g in node.gpus:
                low, high = caps.ctl.power_limit_range_w(g.index)
                self.gpus[(id(caps), g.index)] = _Gpu(caps, g.index, float(low), float(high))
            caps.park_low = True  # a GPU its job left goes to its lowest limit
        lowest = sum(self._counted_w(k, g, g.low_w) for k, g in self.gpus.items())
        if lowest > self.limit_w:
            raise ConfigError(
                f"invalid --power-limit: {self.limit_w:.10g} W is less than the "
                f"{len(self.gpus)} GPUs' lowest power limits together ({lowest:.0f} W)"
                + (", unreachable servers' GPUs at their highest" if self.down else "")
            )
        sized = {id(c) for n, c in self.caps.by_node.items() if n in stored}
        rest = sum(g.low_w for k, g in self.gpus.items() if k[0] not in sized)
        for node in self.nodes:  # each right-sized server, the others off, can be woken
            caps = self.caps.by_node.get(node.name)
            mine = [g for k, g in self.gpus.items() if caps is not None and k[0] == id(caps)]
            high = sum(g.high_w for g in mine)
            if mine and node.name in stored and high + rest > self.limit_w:
                raise ConfigError(
                    f"invalid --power-limit: {self.limit_w:.10g} W could never wake node "
                    f"{node.name} (right-sized): its {len(mine)} GPUs at their highest "
                    f"limits ({high:.0f} W) and the GPUs of the servers not right-sized at "
                    f"their lowest ({rest:.0f} W) exceed it, every other right-sized server off"
                )

    def _stored_power(self) -> dict[str, str | None]:  # right-sized servers' stored states
        return stored_power(self.db, self.nodes)

    def _stored_ranges(self) -> dict:  # (node, GPU index) -> sitestore.StoredRange
        return stored_ranges(self.db, [n.name for n in self.nodes if n.gpu_count])

    # -- unreachable servers ------------------------------------------------------------
    def _is_down(self, name: str, caps: PowerCaps) -> bool:
        return caps.ctl is not None and (caps.unreachable or name in self.unreachable())

    def _budget_down(self, node: ResolvedNode, caps: PowerCaps, into: set[int],
                     ranges: dict, sized: bool) -> None:  # fmt: skip
        """A server down (``into`` ``down``) or off at start: its GPUs' range as discovery
        stored it (else their type's curve; refused for a right-sized server), not set;
        counted at their highest (down) or 0 W (off) until it answers."""
        curve = curve_for(node.model_of([g.index for g in node.gpus]))
        for g in node.gpus:
            low, high = range_of(ranges, node.name, g.index, float(curve.max_limit_w),
                                 curve.min_fraction, sized, curve.gpu != "generic")  # fmt: skip
            self.gpus[(id(caps), g.index)] = _Gpu(caps, g.index, low, high)
        into.add(id(caps))
        if into is self.down:
            log.warning("node %s is unreachable: its GPUs count at their highest limit "
                        "(%.0f W each) until it answers", node.name, high)  # fmt: skip

    def _counted_w(self, key: GpuKey, gpu: _Gpu, settable: float) -> float:
        """What a GPU counts: 0 W on a server off, its limit last read on one powering off,
        its highest on one that does not answer or may be on, else ``settable``."""
        if key[0] in self.off:
            return 0.0
        if key[0] in self.parking:
            return self.last.get(key, gpu.high_w)
        return gpu.high_w if key[0] in self.down else settable

    def _settable(self, key: GpuKey) -> bool:
        return key[0] not in self.off | self.parking | self.down

    def _read(self) -> dict[GpuKey, float]:
        """The limit in force on every GPU of the servers that answer; one that does not
        (the executor says so, a read fails) or may be on is down: its GPUs count at their
        highest, not set; one off or powering off is not read. One back is set up again
        (its limits may be at their defaults: the next split lowers them first)."""
        before = self.down | self.off  # not read last time: their range is read again
        self.answered = {n for n in self.answered if self.power(n) == OFF}  # until it says on
        states = {id(c): ON if n in self.answered else self.power(n)
                  for n, c in self.caps.by_node.items()}  # fmt: skip
        self.off = {i for i, s in states.items() if s == OFF}
        lost = {id(c) for n, c in self.caps.by_node.items() if n in self.unreachable()}
        self.parking = {i for i, s in states.items() if s == POWERING_OFF} - lost  # the worse
        gone = lost | {i for i, s in states.items() if s == MAY_BE_ON}
        gone -= self.off | self.parking
        now: dict[GpuKey, float] = {}
        for key, gpu in self.gpus.items():
            if key[0] in gone or key[0] in self.off or key[0] in self.parking:
                continue
            try:
                if not gpu.caps.enabled and not gpu.caps.ctl.supports_power_limit(gpu.index):
                    raise ConfigError("cannot set its power limits")
                now[key] = gpu.caps.ctl.power_limit_w(gpu.index)
                if key[0] in before:  # back: its real range
                    low, high = gpu.caps.ctl.power_limit_range_w(gpu.index)
                    gpu.low_w, gpu.high_w = float(low), float(high)
            except Exception as exc:
                log.warning("GPU %s: cannot read its power limit: %s", gpu.index, exc)
                gone.add(key[0])
        now = {k: w for k, w in now.items() if k[0] not in gone}
        self.last.update(now)
        for back in {k[0] for k in now} & before:
            caps = next(g.caps for k, g in self.gpus.items() if k[0] == back)
            caps.enabled, caps.park_low = True, True
            log.info("a server's GPUs answer again: the site limit is split over them")
        self.down = gone
        return now

    # -- the jobs that hold GPUs --------------------------------------------------------
    def _gpu_keys(self, parts: list[tuple[str, list[int]]]) -> list[GpuKey]:
        keys = [(id(self.caps.by_node.get(n)), i) for n, gpus in parts for i in gpus]
        return [k for k in dict.fromkeys(keys) if k in self.gpus]

    def _model(self, node: str) -> str | None:
        found = next((n for n in self.nodes if n.name == node), None)
        return found.model_of([g.index for g in found.gpus]) if found else None

    def _holding(self) -> list[_Job]:
        with self.db.read() as session:
            rows = session.exec(
                select(Attempt).where(col(Attempt.state).in_(attempts.values(attempts.HOLDING)))
            ).all()
        jobs = []
        for att in rows:
            if att.job_id in self.pending or att.state == AttemptState.STOPPED:
                continue  # a stopped job's GPUs are parked at their lowest (idle)
            parts = [(p["node"], p["gpu_ids"]) for p in att.parts] if att.parts else None
            keys = self._gpu_keys(parts or [(att.node, att.gpu_ids)])
            if keys:
                self._measure(att)
                jobs.append(_Job(("attempt", att.id), att.node, keys, self._model(att.node),
                                 att.cap or 1.0, self.samples.get(att.id, [])))  # fmt: skip
        live = {j.key[1] for j in jobs}
        for table in (self.fraction, self.samples, self.seen):
            for gone in [i for i in table if i not in live]:
                del table[gone]
        return jobs

    def _measure(self, att: Attempt) -> None:
        """A progress rate at the cap that held since the last report (the gradient)."""
        f = self.fraction.get(att.id)
        if att.progress_done is None or att.progress_at is None or f is None:
            return
        at = att.progress_at.timestamp()
        last = self.seen.get(att.id)
        self.seen[att.id] = (att.progress_done, at, f)
        if last is not None and at > last[1] and abs(last[2] - f) < 1e-9:
            rate = (att.progress_done - last[0]) / (at - last[1])
            if rate > 0:
                self.samples.setdefault(att.id, []).append((f, rate))
                del self.samples[att.id][:-50]  # the latest samples

    def _power_job(self, job: _Job) -> PowerJob:
        gpus = [self.gpus[k] for k in job.gpus]
        curve = curve_for(job.model)
        model = lambda f: curve.throughput_fraction(max(f, curve.min_fraction))  # noqa: E731
        return PowerJob(
            key=job.key,
            node=job.node,
            watts=lambda f: sum(g.watts(f) for g in gpus),
            progress=measured_progress(model, job.samples),
            lowest=max(g.low_w / g.high_w for g in gpus),
            highest=job.highest,
            model=model,  # the floor a measured gradient (what the job wrote) cannot go under
        )

    def _split(self, jobs: list[_Job]) -> tuple[dict[GpuKey, float], dict, bool]:
        """Watts per GPU of the servers that answer (idle ones at their lowest), each
        job's cap, and whether it fits; an unreachable server's GPUs count at their highest."""
        jobs = [j for j in jobs if all(self._settable(k) for k in j.gpus)]
        owned: set[GpuKey] = set()  # a shared GPU (co-location) counts once: its first job's
        mine = []
        for j in jobs:
            own = [k for k in j.gpus if k not in owned]
            owned.update(own)
            if own:  # a job all of whose GPUs another holds runs under that one's limits
                mine.append(j if len(own) == len(j.gpus) else replace(j, gpus=own))
        jobs = mine
        held = {k for j in jobs for k in j.gpus}
        fixed_w = sum(self._counted_w(k, g, g.low_w) for k, g in self.gpus.items() if k not in held)
        caps, fits = split_fair([self._power_job(j) for j in jobs], self.limit_w, fixed_w)
        targets = {k: g.low_w for k, g in self.gpus.items() if self._settable(k)}
        for j in jobs:
            for k in j.gpus:
                targets[k] = self.gpus[k].watts(caps[j.key])
        return targets, caps, fits

    # -- admission and launch -----------------------------------------------------------
    def admits(self, job_id: int, parts: list[tuple[str, list[int]]], highest: float) -> bool:
        """Whether a job may start on ``parts`` ((node, GPUs)): the split with it fits,
        and the limits it lowers were lowered (its own GPUs are raised at its launch)."""
        keys = self._gpu_keys(parts)
        if not keys:
            return True  # no GPU whose limit counts
        new = _Job(("job", job_id), parts[0][0], keys, self._model(parts[0][0]), highest)
        now_w = self._read()
        if not all(self._settable(k) for k in keys):
            self.refused[job_id] = "its server does not answer, so its GPUs' limits cannot be set"
            return False
        fits, lowered = self._lower_for([*self._holding(), *self.pending.values(), new], now_w)
        if not fits:
            log.info("job %s waits: the site power limit (%.0f W) does not fit it even at "
                     "every job's lowest limit", job_id, self.limit_w)  # fmt: skip
            self.refused[job_id] = (
                f"the site power limit ({self.limit_w / 1000:g} kW) does not fit it even at "
                "every job's lowest limit"
            )
            return False
        if not lowered:
            self.refused[job_id] = "the other jobs' power limits could not be lowered yet"
            return False
        self.refused.pop(job_id, None)
        self.pending[job_id] = new
        return True

    def _lower_for(self, jobs: list[_Job], now_w: dict[GpuKey, float]) -> tuple[bool, bool]:
        """The split over ``jobs``: whether it fits, and whether what it lowers was lowered
        (the GPUs of jobs not started yet are raised at their launch)."""
        targets, caps, fits = self._split(jobs)
        if not fits:
            return False, False
        pending = {k for j in jobs if j.key[0] == "job" for k in j.gpus}
        lowered = {k: w for k, w in targets.items() if k not in pending}
        if not self._apply(lowered, increases=False, now_w=now_w):
            return True, False
        self.targets = targets
        for j in jobs:  # the caps lowered now: a progress report across them measures nothing
            if j.key[0] == "attempt" and caps.get(j.key, 1.0) < self.fraction.get(j.key[1], 1.0):
                self.fraction[j.key[1]] = caps[j.key]
        return True, True

    def wakes(self, name: str, key: object = None) -> bool:
        """Whether right-sizing may wake ``name`` for job ``key`` (None: the plan's next
        jobs): an admission. The split with its GPUs at their highest (their default
        after a boot) must fit, and what it lowers is lowered first; else it stays off
        and the job waits, saying why."""
        caps = self.caps.by_node.get(name)
        mine = [g for k, g in self.gpus.items() if caps is not None and k[0] == id(caps)]
        if not mine:
            return True
        now_w = self._read()
        was = (set(self.off), set(self.parking), set(self.down))
        self.off.discard(id(caps))
        self.parking.discard(id(caps))
        self.down.add(id(caps))  # counted at its highest from now on (it may be on)
        fits, lowered = self._lower_for([*self._holding(), *self.pending.values()], now_w)
        if fits and lowered:
            if isinstance(key, tuple) and len(key) == 2 and key[0] == "job":
                self.refused.pop(key[1], None)
            return True
        self.off, self.parking, self.down = was
        why = (
            f"waking {name} ({len(mine)} GPUs at {mine[0].high_w:.0f} W) would exceed the "
            f"site limit of {self.limit_w:.0f} W"
            if not fits
            else f"waking {name} waits: the other jobs' power limits could not be lowered yet"
        )
        if isinstance(key, tuple) and len(key) == 2 and key[0] == "job":
            self.refused[key[1]] = why
        log.debug("node %s stays off: %s", name, why)
        return False

    def launch_limits(self, job_id: int) -> None:
        """Just before an admitted job starts: its GPUs up to their share."""
        job = self.pending.pop(job_id, None)
        if job is not None:
            now_w = self._read()
            self._apply({k: self.targets[k] for k in job.gpus if k in self.targets},
                        increases=True, now_w=now_w)  # fmt: skip

    def in_force_w(self) -> float:
        """The sum of the limits in force now (an unreachable server's GPUs: their highest)."""
        now_w = self._read()
        return round(sum(self._counted_w(k, g, now_w.get(k, g.high_w))
                         for k, g in self.gpus.items()), 1)  # fmt: skip

    # -- after every pass ---------------------------------------------------------------
    def rebalance(self) -> None:
        """Split the limit again over the jobs that hold GPUs: decreases first."""
        self.pending.clear()
        self._prune_refused()
        now_w = self._read()
        jobs = self._holding()
        targets, caps, fits = self._split(jobs)
        if not fits:
            log.warning("the jobs holding GPUs count more than the site power limit (%.0f W) "
                        "even at their lowest limits", self.limit_w)  # fmt: skip
        if self._apply(targets, increases=True, now_w=now_w):
            self.targets = targets
            for j in jobs:
                if j.key in caps:
                    self.fraction[j.key[1]] = caps[j.key]

    def _prune_refused(self) -> None:
        """Notes only of jobs that still wait (one cancelled or running says nothing)."""
        if self.refused and self.db is not None:
            for job_id in set(self.refused) - still_waiting(self.db, list(self.refused)):
                del self.refused[job_id]

    def _apply(self, targets: dict[GpuKey, float], increases: bool,
               now_w: dict[GpuKey, float] | None = None) -> bool:  # fmt: skip
        """Set the limits (``now_w``: those in force, from ``_read``; a GPU not there is
        on a server that does not answer: left alone): every decrease, then
        (``increases``, and only when every decrease was made) every increase. Returns
        whether all were made."""
        now_w = self._read() if now_w is None else now_w
        moves = []
        for key, want in targets.items():
            gpu, now = self.gpus[key], now_w.get(key)
            if now is None:
                continue
            if abs(now - want) > 0.5:
                moves.append((want - now, gpu, want))
        ok = True
        for delta, gpu, want in sorted(moves, key=lambda m: m[0]):
            if delta > 0 and (not increases or not ok):
                break
            try:
                gpu.caps.ctl.set_power_limit_w(gpu.index, want)
                self.last[(id(gpu.caps), gpu.index)] = want
            except Exception as exc:  # a server that went away: no increase this time
                log.warning("GPU %s: cannot set its power limit to %.0f W: %s",
                            gpu.index, want, exc)  # fmt: skip
                ok = False
        return ok
