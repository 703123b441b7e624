"""Co-location moves that empty a server, so right-sizing can power it down.

After a busy stretch ends, the jobs still running are scattered: a server holds one or two
jobs alone and six or seven idle GPUs, and stays on (drawing their idle power and its own)
until its last job ends. Measured on the co-location benchmark (2,000 Philly jobs, 256
GPUs): 6-7 kW of idle draw for hours, some ten servers each kept on by one or two jobs.

With co-location moves on (``[jobs] moves``) and right-sizing on for the server, when no
job waits for GPUs: a server whose jobs all run alone and may share and be interrupted is
emptied when each of them can join a job running alone on another server (same GPU type,
the pairing rule: ``SharingDaemon._hosts``) and the moves pay, all of them together:

    the pairs' predicted saving, less ``MOVE_MARGIN`` × each checkpoint's cost
    (``interference.move_gain_j``), plus the idle draw the server no longer has for as
    long as its last job would have run there (its free GPUs' share of the server's idle
    draw, × PUE).

The emptiest servers go first. A server that receives a job in this step is not emptied in
it, and the jobs of a pair never move (pairs make a server ineligible), so no job moves
back and forth. Pure on the simulator's state: it says which moves; the simulator makes
them (``SharingDaemon._regroup``).
"""

from __future__ import annotations

from orchestrator.planning.devices.interference import move_gain_j
from orchestrator.sim.hardware.power import ON


def evacuations(daemon, now: float) -> list[tuple[int, tuple[int, float, float]]]:
    """The moves that empty servers now, as (job, (host, its speed, the host's speed))."""
    power, alloc = daemon.power, daemon.alloc
    if not power.enabled:
        return []
    jobs_on = _jobs_on(daemon)
    free = dict(zip(alloc.node_names, alloc.free_per_node(), strict=True))
    nodes = {n.name: n for n in power.nodes}
    candidates = [
        name
        for name, jobs in jobs_on.items()
        if jobs and nodes[name].state == ON and nodes[name].off_after_s is not None
        and all(_movable(daemon, i) for i in jobs)
    ]  # fmt: skip
    candidates.sort(key=lambda name: (nodes[name].gpus - free[name], name))
    receiving: set[str] = set()
    emptied: set[str] = set()
    taken: set[int] = set()
    out: list[tuple[int, tuple[int, float, float]]] = []
    for name in candidates:
        if name in receiving:
            continue
        plan = _empty(daemon, name, jobs_on[name], emptied | {name}, taken, now)
        if plan is None:
            continue
        moves, gain_j = plan
        node = nodes[name]
        last_s = max(daemon.executor.remaining_s(daemon._running[daemon._att_of[i]].handle)
                     for i in jobs_on[name])  # fmt: skip
        idle_j = node.idle_w * power.pue * free[name] / node.gpus * last_s
        if gain_j + idle_j <= 0:
            continue
        emptied.add(name)
        for x, host in moves:
            taken.add(host[0])
            receiving.add(alloc.node_of(("job", host[0])))
            out.append((x, host))
    return out


def _jobs_on(daemon) -> dict[str, list[int]]:
    """Each node's running jobs that hold GPUs there (a pair's host only; a job on several
    nodes makes each of its nodes ineligible: listed with -1)."""
    alloc = daemon.alloc
    out: dict[str, list[int]] = {name: [] for name in alloc.node_names}
    names = alloc.node_names
    for key, parts in alloc.held_masks().items():
        if not (isinstance(key, tuple) and len(key) == 2 and key[0] == "job"):
            continue  # a node off
        for index, _ in parts:
            out[names[index]].append(key[1] if len(parts) == 1 else -1)
    return out


def _movable(daemon, i: int) -> bool:
    """A job alone on its GPUs that may share and be interrupted, not stopping already."""
    if i < 0 or i not in daemon._open or not daemon._interruptible[i]:
        return False
    att = daemon._running.get(daemon._att_of.get(i, -1))
    return att is not None and att.suspend_event is None


def _empty(daemon, name: str, jobs: list[int], avoid: set[str], taken: set[int], now: float):
    """A host elsewhere for each of ``jobs`` (the best gain each; hosts not on ``avoid``'s
    nodes nor already taken), and the moves' total gain; None when one has none."""
    alloc, ckpt = daemon.alloc, daemon.inputs.checkpoint_s
    moves, total, mine = [], 0.0, set(taken)
    for x in jobs:
        att = daemon._running[daemon._att_of[x]]
        left = daemon.executor.remaining_s(att.handle)
        done = daemon.executor.done_now(att.handle)
        if left is None or done is None:
            return None
        job = daemon._queued(x, daemon._duration[x] * (1.0 - done) + ckpt)
        gpu, best = daemon._gpu_type(x), None
        for _, h, speed_x, speed_h, left_h in daemon._hosts(job, att.gpus, 1.0, now):
            if h in mine or alloc.node_of(("job", h)) in avoid or daemon._gpu_type(h) != gpu:
                continue
            power_h = daemon._running[daemon._att_of[h]].power_w
            gain = move_gain_j(att.power_w, power_h, speed_x, speed_h, left, left_h, ckpt)
            if best is None or gain > best[0]:
                best = (gain, h, speed_x, speed_h)
        if best is None:
            return None
        mine.add(best[1])
        moves.append((x, best[1:]))
        total += best[0]
    return moves, total
