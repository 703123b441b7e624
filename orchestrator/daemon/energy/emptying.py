"""Co-location moves that empty a server on the live daemon (``daemon.moves =
"empty-servers"`` or ``true``), so right-sizing can power it off: the simulator's rule
(``sim.hardware.evacuation``), chosen here, made by ``Mover`` (``daemon.energy.moves``).

While no job waits for GPUs and no earlier move is in flight, one server is emptied at a
pass, if one may be:

- right-sizing may power it off (``power_off``, ``power_on`` and ``idle_off_after`` set;
  it is on; its last ``power_off`` since it came on neither failed nor was refused:
  ``Levers.emptiable``), it answers, and it shares;
- everything that holds GPUs there (its attempts, and what the pass's allocator holds:
  resize reservations, backfill blocks, jobs just launched) is a job that may move
  (``Mover._may_move``: ``--share --interruptible --duration``, alone on its GPU, not
  leaving, not running a planned piece, run long enough), none of them booked as a moved
  job's host; a job of a pair, or across servers, keeps its server on;
- each of them may join a job alone on another server that answers (``Sharing.joins``:
  the same GPU type, one user's jobs unless its node says ``share_users = "any"``, their
  speeds and deadlines), each next to a host of its own (the best net gain each, below),
  no host on the server emptied;
- the moves pay, all of them together, on one basis (IT energy, no PUE on either side):
  the sum of each pair's ``move_gain_j`` (its saving less ``MOVE_MARGIN`` × its
  checkpoint's cost), less each receiving server's idle draw for as long as its moves keep
  it on later than its jobs would have (``_KeptOn``: the host slowed by its paired
  speed, the moved job paired while both run and alone after; only where right-sizing
  may power that server off), plus the idle draw the server emptied no longer has (its
  free GPUs and their share of its own draw, ``IdleMeter.draw_w`` without PUE) from the
  end of its longest checkpoint to the end of the longest work left of its jobs, is
  positive;
- discovery sees no GPU in use there that nothing the pass knows holds (someone else's
  process keeps it on).

The emptiest servers (fewest GPUs held) go first; the first that may be emptied has its
moves sent in that pass, the best pair gain first, and none after one that is not
delivered (``Mover._step``: the server then stays on, its moves sent already go ahead; a
server that receives a job is never the one emptied, and the jobs of a pair never move);
then none until they have left (``Mover._in_flight``). Right-sizing powers the server off
once idle, if it then can (its ``power_off`` may still be refused).
"""

from __future__ import annotations

from sqlmodel import col, select

from orchestrator.daemon.energy.sharing import _policy
from orchestrator.nodes.idleask import gpu_use
from orchestrator.planning.devices.interference import pair_ends_s
from orchestrator.queue.attempts import HOLDING, values
from orchestrator.queue.models import Attempt, Gpu, Job


def emptying(mover, now_s: float) -> list:
    """The moves that empty one server now (each a ``moves.Move`` with ``server`` set;
    none: []), for ``mover`` (``moves.Mover``, which calls this: its rules, its gains)."""
    sharing = mover.sharing
    nodes = {n.name: n for n in sharing.nodes if _policy(n) != "never"}
    down = set(mover.down())
    names = [name for name in mover.emptiable() if name in nodes and name not in down]
    if not names:
        return []
    alone = sharing._alone(nodes)
    if len(alone) < 2:
        return []
    hosts = {b.host_attempt for b in sharing.booked.values()}
    movers = {
        att.id: (att, job)
        for att, job in alone
        if att.node in names and att.id not in hosts and mover._may_move(att, job, now_s, down)
    }
    held, busy, gpus = _held(mover, list(nodes))
    foreign = _foreign(mover, names, gpus)
    candidates = [n for n in names if held.get(n) and held[n] <= set(movers) and n not in foreign]
    candidates.sort(key=lambda n: (busy.get(n, 0), n))
    before = sharing.earlier_s([att for att, _ in alone]) if candidates else {}
    for name in candidates:
        jobs = [movers[i] for i in sorted(held[name])]
        moves = _plan(mover, name, jobs, alone, nodes, now_s, down, before, busy)
        if moves:
            return moves
    return []


def _plan(mover, name: str, jobs: list, alone: list, nodes: dict, now_s: float,
          down: set, before: dict, busy: dict) -> list | None:  # fmt: skip
    """A host elsewhere for each of ``jobs`` (distinct hosts, the best net gain each), when
    the moves pay with the idle draw the server saves; else None."""
    taken = set(mover.sharing.booked_gpus())
    kept = _KeptOn(mover, nodes, now_s, busy)
    moves, gain_j, last_s, ckpt_s = [], 0.0, 0.0, 0.0
    for att, job in jobs:
        best = mover.best_host(att, job, alone, nodes, now_s, down, before, taken, {name}, kept)
        left = mover.work_left(job, att, now_s, before.get(att.id, 0.0))
        if best is None or left is None:
            return None
        best.server = name
        taken.add((best.host_att.node, best.host_att.gpu_ids[0]))  # one job per host
        moves.append(best)
        gain_j += best.gain_j - best.kept_j
        last_s = max(last_s, left)
        ckpt_s = max(ckpt_s, best.ckpt_s)
    # the server stays on while its jobs checkpoint: saved from the longest's end on
    idle_w = mover.idle_w(name, nodes[name].gpu_count, busy.get(name, 0))
    return moves if gain_j + idle_w * max(0.0, last_s - ckpt_s) > 0 else None


class _KeptOn:
    """What a move costs the server receiving it: its idle draw for as long as the move
    keeps it on later than its jobs would have kept it (only a server right-sizing may
    power off; a job there without an estimate is left out, so this counts at most)."""

    def __init__(self, mover, nodes: dict, now_s: float, busy: dict) -> None:
        self.mover, self.nodes, self.now_s, self.busy = mover, nodes, now_s, busy
        self.managed = set(mover.emptiable())
        self.ends: dict[str, dict[int, float]] = {}

    def __call__(self, move) -> float:
        node = move.host_att.node
        if node not in self.managed or node not in self.nodes or min(move.speeds) <= 0:
            return 0.0  # (a speed of 0: ``move_gain_j`` says -inf already)
        if node not in self.ends:
            self.ends[node] = _ends_s(self.mover, node, self.now_s)
        others = [e for i, e in self.ends[node].items() if i != move.host_att.id]
        before = max([move.host_left_s, *others])
        work_x = move.left_s + move.ckpt_s  # its checkpoint's cost counted, as move_gain_j does
        after = max(before, *pair_ends_s(work_x, move.host_left_s, *move.speeds))
        watts = self.mover.idle_w(node, self.nodes[node].gpu_count, self.busy.get(node, 0))
        return watts * (after - before)


def _ends_s(mover, node: str, now_s: float) -> dict[int, float]:
    """When each job holding GPUs on ``node`` with an estimate ends, from now, by attempt
    (its work left: at full speed)."""
    with mover.sharing.db.read() as session:
        rows = session.exec(
            select(Attempt, Job)
            .join(Job, col(Job.id) == col(Attempt.job_id))
            .where(col(Attempt.state).in_(values(HOLDING)), Attempt.node == node)
        ).all()
    before = mover.sharing.earlier_s([att for att, _ in rows])
    ends = {att.id: mover.work_left(job, att, now_s, before.get(att.id, 0.0)) for att, job in rows}
    return {i: e for i, e in ends.items() if e is not None}


def _foreign(mover, names: list[str], gpus: dict[str, set]) -> set[str]:
    """Of ``names``, the servers where discovery last saw a GPU in use that nothing the
    daemon knows of holds (someone else's process: it keeps the server on)."""
    with mover.sharing.db.read() as session:
        rows = session.exec(select(Gpu).where(col(Gpu.node).in_(names))).all()
    return {
        g.node for g in rows
        if g.memory_used_mb is not None and g.utilization_pct is not None
        and gpu_use(g.memory_used_mb, g.utilization_pct) is not None
        and g.index not in gpus.get(g.node, ())
    }  # fmt: skip


def _held(mover, names: list[str]) -> tuple[dict[str, set], dict[str, int], dict[str, set]]:
    """On each of ``names``: what holds GPUs there (attempt ids; ``None`` for anything
    else: a job across servers, a reservation, a block), how many GPUs are held, and which."""
    held: dict[str, set] = {}
    gpus: dict[str, set] = {}
    with mover.sharing.db.read() as session:
        rows = session.exec(
            select(Attempt.id, Attempt.node, Attempt.gpu_ids, Attempt.parts).where(
                col(Attempt.state).in_(values(HOLDING))
            )
        ).all()
    for att_id, node, gpu_ids, parts in rows:
        for part in parts or ():  # a job across servers: it keeps each of them on
            if part.get("node") in names:
                held.setdefault(part["node"], set()).add(None)
        if node in names and not parts:
            held.setdefault(node, set()).add(att_id)
            gpus.setdefault(node, set()).update(gpu_ids or ())
    alloc = mover.alloc()
    for key, got in (alloc.allocations() if alloc is not None else {}).items():
        attempt = isinstance(key, tuple) and len(key) == 2 and key[0] == "attempt"
        for node, ids in got.parts:
            if node in names:
                held.setdefault(node, set()).add(key[1] if attempt else None)
                gpus.setdefault(node, set()).update(ids)
    return held, {name: len(ids) for name, ids in gpus.items()}, gpus
