"""Splitting running pairs in what-if runs (EaCO's early-stage observations).

``MOVE_AFTER_S`` after two jobs pair (``SharingDaemon._pair``), each one's true speed next
to the other is known (what Gavel measured, with ``[jobs] pair_speeds``; else the model's
prediction). After each pass, a job of a pair is checkpointed (SIGTERM: it loses
``checkpoint_cost`` of run time, as any restart does) and restarts at once alone, at its
planned cap, when it may be interrupted, its work left at that speed (until its partner
ends or its piece does; alone after) would end after its deadline, alone it would still
keep it (its work left plus the checkpoint's cost at full speed), GPUs are free for it now
(of the type it asked for; one split per free GPU), and no job due waits for GPUs (it
would restart behind it): ``planning.devices.splitting``, the daemon's rule. In that
attempt it is not paired, neither joining a job nor joined. Its partner runs alone at
full speed from then on. A pass comes ``MOVE_AFTER_S`` after a pair forms only where the
rule would then split one of it. Always on where jobs share (a split only protects a
deadline); counted in ``result.splits``.
"""

from __future__ import annotations

import signal

from orchestrator.planning.devices.interference import MOVE_AFTER_S
from orchestrator.planning.devices.splitting import Member, should_split, to_split
from orchestrator.planning.pieces import piece_index
from orchestrator.planning.policies.base import Decision


class Splits:
    """The simulator's pair splits, for ``SharingDaemon`` (``daemon``)."""

    def __init__(self, daemon) -> None:
        self.d = daemon
        self.speed: dict[int, tuple[float, float]] = {}  # paired job -> (speed, since)
        self.alone_next: set[int] = set()  # split: not paired at its next start
        self.restarting: dict[int, float] = {}  # split job -> the cap it restarts at
        self.count = 0

    def paired(self, i: int, speed: float, now: float) -> None:
        """Job ``i`` runs at ``speed`` next to a partner from ``now``: a pass once that
        speed is known, where the rule would split it then (a pass more elsewhere would
        change nothing but the passes' timing)."""
        self.speed[i] = (speed, now)
        member = self._member(i, speed, now)
        if member is not None and should_split(member, now + MOVE_AFTER_S):
            self.d._wake(now + MOVE_AFTER_S + 1e-6)  # not rounded under

    def _member(self, i: int, speed: float | None, now: float) -> Member | None:
        """Job ``i`` as the rule reads it: its work left at full speed, its partner's end
        (its piece's, or its work's at its speed now)."""
        d = self.d
        att = d._running.get(d._att_of.get(i, -1))
        left = d.executor.remaining_s(att.handle) if att is not None else None
        if left is None:
            return None
        other = d._running.get(d._att_of.get(d._partner.get(i, -1), -1))
        until = None if other is None else other.end_s
        return Member(i, speed, left * (speed or 1.0), d._deadline[i],
                      bool(d._interruptible[i]), d.inputs.checkpoint_s, until)  # fmt: skip

    def left(self, i: int) -> None:
        """Job ``i`` no longer runs next to a partner."""
        self.speed.pop(i, None)

    def step(self, now: float) -> bool:
        """Checkpoint each job at risk by the rule; True when one was (a pass at once)."""
        d = self.d
        if not self.speed or d.scheduler.blocked() is not None:
            return False  # a job waits for GPUs: one split would wait behind it
        members = []
        for i, (speed, since) in self.speed.items():
            if now - since >= MOVE_AFTER_S and (member := self._member(i, speed, now)):
                members.append(member)
        split, probes = [], []
        for i in to_split(members, now):
            att = d._running[d._att_of[i]]
            key = ("split", i)  # GPUs free for it now, else waiting would not save it
            if d.alloc.allocate(key, att.gpus, d._wants[i]) is None:
                continue
            probes.append(key)  # held until all are chosen: one free GPU, one split
            split.append(i)
            self.restarting[i] = att.decision.piece_config(piece_index(att.decision, now))[1]
            self.alone_next.add(i)
            self.count += 1
            d.executor.signal(att.handle, signal.SIGTERM)
        for key in probes:
            d.alloc.free(key)
        return bool(split)

    def requeue(self, att, now: float) -> bool:
        """A split job restarts at once (at its planned cap), alone; False for any other."""
        i = att.job.id
        cap = self.restarting.pop(i, None)
        if cap is None:
            return False
        d = self.d
        left = d._duration[i] * (1.0 - d.done[i]) + d.inputs.checkpoint_s
        d.scheduler.add_planned(d._queued(i, left), Decision(now, gpus=att.gpus, cap=cap))
        return True
