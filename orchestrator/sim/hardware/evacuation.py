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
    draw, × PUE, as the jobs' draws count it), less the idle draw of each server that
    receives a job for as long as it then stays on longer (the host slowed down, the moved
    job's end; only where right-sizing would power that server off).

The emptiest servers go first. A server that receives a job in this step is not emptied in
it, the jobs of a pair never move (pairs make a server ineligible), and a job moves no
sooner than ``MOVE_AFTER_S`` (10 min) plus twice its checkpoint cost after it started, as
on the daemon. Each job's draw and cap are those it runs at now (a planned cap, or one the
site limit set); it restarts at that cap. Pure on the simulator's state: it says which
moves; the simulator makes them (``SharingDaemon._regroup``).
"""

from __future__ import annotations

from orchestrator.planning.devices.interference import may_move_again, move_gain_j, pair_ends_s
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
        and all(_movable(daemon, i, now) for i in jobs)
    ]  # fmt: skip
    candidates.sort(key=lambda name: (nodes[name].gpus - free[name], name))
    receiving: set[str] = set()
    emptied: set[str] = set()
    taken: set[int] = set()
    out: list[tuple[int, tuple[int, float, float]]] = []
    for name in candidates:
        if name in receiving:
            continue
        moves, gain_j = _empty(daemon, name, jobs_on, emptied | {name}, taken, now, free)
        if moves is None:
            continue
        last_s = max(_left_s(daemon, i) for i in jobs_on[name])
        if gain_j + _idle_w(daemon, name, free) * last_s <= 0:
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


def _movable(daemon, i: int, now: float) -> bool:
    """A job alone on its GPUs that may share and be interrupted, not stopping already,
    that has run long enough to move (``may_move_again``)."""
    if i < 0 or i not in daemon._open or not daemon._interruptible[i]:
        return False
    att = daemon._running.get(daemon._att_of.get(i, -1))
    if att is None or att.suspend_event is not None:
        return False
    return may_move_again(now - att.start_s, daemon.inputs.checkpoint_s)


def _left_s(daemon, i: int) -> float:
    """Job ``i``'s time left at its speed now (0: unknown, or ending)."""
    att = daemon._running.get(daemon._att_of.get(i, -1))
    left = None if att is None else daemon.executor.remaining_s(att.handle)
    return left or 0.0


def _last_end_s(daemon, jobs: list[int], skip: int) -> float:
    """When the last of ``jobs`` (and their partners) ends from now, ``skip`` left out."""
    ends = [0.0]
    for i in jobs:
        if i != skip and i >= 0:
            ends.append(_left_s(daemon, i))
            partner = daemon._partner.get(i)
            if partner is not None:
                ends.append(_left_s(daemon, partner))
    return max(ends)


def _idle_w(daemon, name: str, free: dict[str, int]) -> float:
    """The idle draw of ``name``'s free GPUs (their share of its idle draw, × PUE): what
    it draws besides its jobs while on."""
    node = next(n for n in daemon.power.nodes if n.name == name)
    return node.idle_w * daemon.power.pue * free[name] / node.gpus


def _empty(daemon, name: str, jobs_on, avoid: set[str], taken: set[int], now: float, free):
    """A host elsewhere for each of ``name``'s jobs (the best gain each, net of the idle
    draw of the receiving server kept on longer; hosts not on ``avoid``'s nodes nor already
    taken), as (moves, their total gain); (None, 0) when one has none."""
    alloc, ckpt = daemon.alloc, daemon.inputs.checkpoint_s
    right_sized = {n.name for n in daemon.power.nodes if n.off_after_s is not None}
    moves, total, mine = [], 0.0, set(taken)
    for x in jobs_on[name]:
        att = daemon._running[daemon._att_of[x]]
        left = daemon.executor.remaining_s(att.handle)
        done = daemon.executor.done_now(att.handle)
        cap_w = daemon.executor.cap_of(att.handle)  # (cap, watts) now
        if left is None or done is None or cap_w is None:
            return None, 0.0
        job = daemon._queued(x, daemon._duration[x] * (1.0 - done) + ckpt)
        gpu, best = daemon._gpu_type(x), None
        for _, h, speed_x, speed_h, left_h in daemon._hosts(job, att.gpus, cap_w[0], now):
            recv = alloc.node_of(("job", h))
            if h in mine or recv in avoid or daemon._gpu_type(h) != gpu:
                continue
            host_w = daemon.executor.cap_of(daemon._running[daemon._att_of[h]].handle)
            if host_w is None:
                continue
            gain = move_gain_j(cap_w[1], host_w[1], speed_x, speed_h, left, left_h, ckpt)
            if recv in right_sized:  # it stays on for them: longer, if they end later
                before = max(_last_end_s(daemon, jobs_on[recv], h), left_h)
                after = max(before, *pair_ends_s(left + ckpt, left_h, speed_x, speed_h))
                gain -= _idle_w(daemon, recv, free) * (after - before)
            if best is None or gain > best[0]:
                best = (gain, h, speed_x, speed_h)
        if best is None:
            return None, 0.0
        mine.add(best[1])
        moves.append((x, best[1:]))
        total += best[0]
    return moves, total
