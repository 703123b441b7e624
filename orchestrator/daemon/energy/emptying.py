"""Co-location moves that empty a server on the live daemon (``daemon.moves =
"empty-servers"`` or ``true``), so right-sizing can power it off: the simulator's rule
(``sim.hardware.evacuation``), chosen here, made by ``Mover`` (``daemon.energy.moves``).

While no job waits for GPUs and no earlier move is in flight, one server is emptied at a
pass, if one may be:

- right-sizing may power it off (``power_off``, ``power_on`` and ``idle_off_after`` set;
  it is on), it answers, and it shares;
- everything that holds GPUs there (its attempts, and what the pass's allocator holds:
  resize reservations, backfill blocks, jobs just launched) is a job that may move
  (``Mover._may_move``: ``--share --interruptible --duration``, alone on its GPU, not
  leaving, not running a planned piece, run long enough), none of them booked as a moved
  job's host; a job of a pair, or across servers, keeps its server on;
- each of them may join a job alone on another server that answers (``Sharing.joins``:
  the same GPU type, one user's jobs unless its node says ``share_users = "any"``, their
  speeds and deadlines), each next to a host of its own (the best gain each), no host on
  the server emptied;
- the moves pay, all of them together: the sum of each pair's ``move_gain_j`` (its
  saving less ``MOVE_MARGIN`` × its checkpoint's cost), plus the idle draw the server no
  longer has (its free GPUs and their share of its own draw, × PUE: the idle accounting's
  ``IdleMeter.draw_w``) for as long as the longest work left of its jobs, is positive.

The emptiest servers (fewest GPUs held) go first; the first that may be emptied has all
its jobs moved in that pass (a server that receives a job is never the one emptied, and
the jobs of a pair never move), then none until they have left (``Mover._in_flight``).
"""

from __future__ import annotations

from sqlmodel import col, select

from orchestrator.daemon.energy.sharing import _policy
from orchestrator.queue.attempts import HOLDING, values
from orchestrator.queue.models import Attempt


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
    held, busy = _held(mover, names)
    candidates = [n for n in names if held.get(n) and held[n] <= set(movers)]
    candidates.sort(key=lambda n: (busy.get(n, 0), n))
    before = sharing.earlier_s([att for att, _ in alone]) if candidates else {}
    for name in candidates:
        jobs = [movers[i] for i in sorted(held[name])]
        moves = _plan(mover, name, jobs, alone, nodes, now_s, down, before, busy.get(name, 0))
        if moves:
            return moves
    return []


def _plan(mover, name: str, jobs: list, alone: list, nodes: dict, now_s: float,
          down: set, before: dict, busy: int) -> list | None:  # fmt: skip
    """A host elsewhere for each of ``jobs`` (distinct hosts), when the moves pay with
    the idle draw the server saves; else None."""
    taken = set(mover.sharing.booked_gpus())
    moves, gain_j, last_s = [], 0.0, 0.0
    for att, job in jobs:
        best = mover.best_host(att, job, alone, nodes, now_s, down, before, taken, {name})
        left = mover.work_left(job, att, now_s, before.get(att.id, 0.0))
        if best is None or left is None:
            return None
        best.server = name
        taken.add((best.host_att.node, best.host_att.gpu_ids[0]))  # one job per host
        moves.append(best)
        gain_j += best.gain_j
        last_s = max(last_s, left)
    idle_j = mover.idle_w(name, nodes[name].gpu_count, busy) * last_s
    return moves if gain_j + idle_j > 0 else None


def _held(mover, names: list[str]) -> tuple[dict[str, set], dict[str, int]]:
    """On each of ``names``: what holds GPUs there (attempt ids; ``None`` for anything
    else: a job across servers, a reservation, a block), and how many GPUs are held."""
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
    return held, {name: len(ids) for name, ids in gpus.items()}
