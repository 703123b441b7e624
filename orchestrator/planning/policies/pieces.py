"""The pieces of a job that may be suspended, worth their checkpoints.

A job run in pieces checkpoints at the end of each but the last and restarts at the start
of each but the first; a restart loses about ``checkpoint_s`` of run time (saving the state,
loading it again, warming up). From the slots the cheapest selection took, ``settle`` keeps
no piece shorter than ``min_piece_s`` (a short piece's slots go to its neighbours' edges),
fills a gap between two pieces when what the gap saves is less than a restart, and gives
each restart ``checkpoint_s`` more of the job's run (``run_needed_s``): the pieces cover the
job's run time and its restarts', so a job planned in pieces still ends by its deadline.
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np

# no piece shorter than two slots up to 30 min (two of the daemon's 15-minute slots), nor
# than a checkpoint
MIN_PIECE_S = 1800.0
MIN_PIECE_SLOTS = 2


def min_piece_s(checkpoint_s: float, slot_s: float) -> float:
    """The shortest piece a job that may be suspended is planned in (its last excepted)."""
    return max(checkpoint_s, min(MIN_PIECE_S, MIN_PIECE_SLOTS * slot_s))


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The runs of consecutive True slots, as (first, last) inclusive."""
    padded = np.zeros(len(mask) + 2, dtype=bool)
    padded[1:-1] = mask
    edges = np.flatnonzero(padded[1:] != padded[:-1]).tolist()  # each run's start, end + 1
    return list(zip(edges[::2], [b - 1 for b in edges[1::2]], strict=True))


def _cum(lengths: np.ndarray) -> np.ndarray:
    """Sums of ``lengths`` for ``_size``, leaving out the first (partly past) slot, so
    that the sizes of pieces of whole slots are exact and ties stay ties."""
    return np.concatenate(([0.0, 0.0], np.cumsum(lengths[1:])))


def _size(cum: np.ndarray, lengths: np.ndarray, a: int, b: int) -> float:
    """The seconds of slots a..b."""
    size = float(cum[b + 1] - cum[a])
    return size + float(lengths[0]) if a == 0 else size


def run_needed_s(run_s: float, checkpoint_s: float, pieces: int) -> float:
    """The run time a job of ``run_s`` needs in ``pieces`` pieces: each restart loses
    ``checkpoint_s`` (saving the state, loading it again, warming up)."""
    return run_s + max(pieces - 1, 0) * checkpoint_s


def settle(
    price: np.ndarray,
    lengths: np.ndarray,
    mask: np.ndarray,
    run_s: float,
    min_piece_s: float,
    checkpoint_s: float,
) -> tuple[np.ndarray, float] | None:
    """``price``: per second of the job in each slot (inf where it does not fit);
    ``lengths``: each slot's seconds; ``mask``: the slots chosen, adding up to at least
    ``run_s``. Returns (mask, cost) with every piece at least ``min(min_piece_s, run_s)``
    long once the surplus is trimmed, or None when the neighbours have no room."""
    min_len = min(min_piece_s, run_s)
    mask = _lengthen(price, lengths, mask.copy(), run_s, min_len, checkpoint_s)
    if mask is None:
        return None
    cum = _cum(lengths)
    finite = np.isfinite(price)
    best = _cost(price, lengths, cum, mask, run_s, min_len, checkpoint_s)
    while True:  # fill the gap whose filling saves most, while any does
        pieces = runs(mask)
        if len(pieces) <= 1:
            break
        end_of = dict(pieces)
        start_of = {b: a for a, b in pieces}
        covered = float(lengths[mask].sum())
        # the edges a shed may drop (one refused for its piece's size stays refused
        # until that piece loses its other edge, which pushes both again)
        base = [
            (-float(price[i]), i)
            for a, b in pieces
            for i in {a, b}
            if _fits(cum, lengths, min_len, a, b, i)
        ]
        heapq.heapify(base)
        trials = []
        for (first, b), (a, last) in itertools.pairwise(pieces):
            if not finite[b + 1 : a].all():
                continue
            trial = mask.copy()
            trial[b + 1 : a] = True
            ends, starts = dict(end_of), dict(start_of)
            del ends[a], starts[b]
            ends[first], starts[last] = last, first
            heap = list(base)
            heapq.heappush(heap, (-float(price[first]), first))
            heapq.heappush(heap, (-float(price[last]), last))
            grown = covered + float(cum[a] - cum[b + 1])
            _shed(
                price, lengths, cum, trial, ends, starts, heap, grown, run_s, min_len, checkpoint_s
            )
            trials.append((_cost(price, lengths, cum, trial, run_s, min_len, checkpoint_s), trial))
        if not trials:
            break
        cost, trial = min(trials, key=lambda x: x[0])
        tol = 1e-9 * max(1.0, abs(best)) if np.isfinite(best) else 0.0
        if not cost < best - tol:
            break
        best, mask = cost, trial
    if not np.isfinite(best):
        return None
    return mask, best


def piece_intervals(
    price: np.ndarray,
    lengths: np.ndarray,
    starts: np.ndarray,
    mask: np.ndarray,
    run_s: float,
    min_piece_s: float,
    checkpoint_s: float,
) -> tuple[tuple[float, float], ...]:
    """The (start, end) pieces of ``mask``, its surplus over the run time they need
    (``run_needed_s``) trimmed where ``_trim`` says."""
    ends = starts + lengths
    out = [[float(starts[a]), float(ends[b])] for a, b in runs(mask)]
    surplus = float(lengths[mask].sum()) - run_needed_s(run_s, checkpoint_s, len(out))
    if surplus > 1e-6:
        cum = _cum(lengths)
        i, at_end = _trim(price, lengths, cum, runs(mask), surplus, min(min_piece_s, run_s))
        piece = next(k for k, (a, b) in enumerate(runs(mask)) if a <= i <= b)
        if at_end:
            out[piece][1] -= surplus
        else:
            out[piece][0] += surplus
    return tuple((a, b) for a, b in out)


def _lengthen(price, lengths, mask, run_s, min_len, checkpoint_s):
    """Drop the shortest piece under ``min_len`` and add the cheapest edge slots of the
    others while the pieces cover less than the run time they need, until none is short.
    (The pieces are kept up to date as slots come and go; the short pieces and the edge
    slots wait in heaps, checked when taken.)"""
    cum = _cum(lengths)
    finite = np.isfinite(price)
    n = len(mask)
    end_of = dict(runs(mask))  # piece start -> its last slot
    start_of = {b: a for a, b in end_of.items()}
    edges: list[tuple[float, int]] = []  # (price, slot) next to a piece
    short: list[tuple[float, int]] = []  # (size, start) of a piece under min_len

    def add_piece(a: int, b: int) -> None:
        end_of[a], start_of[b] = b, a
        size = _size(cum, lengths, a, b)
        if size < min_len - 1e-6:
            heapq.heappush(short, (size, a))
        for j in (a - 1, b + 1):
            if 0 <= j < n and finite[j]:
                heapq.heappush(edges, (float(price[j]), j))

    for a, b in list(end_of.items()):
        add_piece(a, b)
    covered = float(lengths[mask].sum())
    while True:
        dropped = False
        while len(end_of) > 1 and short:
            size, a = heapq.heappop(short)
            if a in end_of and _size(cum, lengths, a, end_of[a]) == size:
                b = end_of.pop(a)
                del start_of[b]
                mask[a : b + 1] = False
                covered -= size
                dropped = True
                break
        # while short pieces go, the job's run; then its restarts' too (counted before,
        # the restarts of pieces about to go would pull in slots no piece needs)
        while (
            covered < (run_s if dropped else run_needed_s(run_s, checkpoint_s, len(end_of))) - 1e-6
        ):
            while edges:  # the cheapest slot next to the pieces left (lowest index on ties)
                _, i = heapq.heappop(edges)
                if not mask[i] and (i - 1 in start_of or i + 1 in end_of):
                    break
            else:
                return None
            mask[i] = True
            covered += float(lengths[i])
            lo, hi = i, i
            if i - 1 in start_of:
                lo = start_of.pop(i - 1)
                del end_of[lo]
            if i + 1 in end_of:
                hi = end_of.pop(i + 1)
                del start_of[hi]
            add_piece(lo, hi)
        if not dropped:
            return mask


def _fits(cum, lengths, min_len, a: int, b: int, i: int) -> bool:
    """Whether dropping edge slot ``i`` leaves piece (a, b) at least ``min_len`` (or gone)."""
    left = _size(cum, lengths, a, b) - float(lengths[i])
    return left >= min_len - 1e-6 or left <= 0


def _shed(
    price, lengths, cum, mask, end_of, start_of, heap, covered, run_s, min_len, checkpoint_s
) -> None:
    """Drop the dearest edge slots of ``mask`` (in place) while the rest still covers the
    run time its pieces need and no piece falls under ``min_len``. ``end_of``/``start_of``:
    its pieces, kept up to date (a dropped edge slot shortens its piece, or removes it);
    ``heap``: its edge slots as (-price, slot), checked when taken: a piece changes only by
    losing an edge, whose new edges are pushed, and the cover only shrinks, so a slot
    refused once stays refused, unless a piece is gone: then the run time needed shrinks
    too, and the slots refused for the cover are taken again."""
    shortest = float(lengths.min())
    refused: list[tuple[float, int]] = []  # for the cover
    singles = sum(a == b for a, b in end_of.items())  # pieces of one slot, which may go
    sums, secs, first_s = cum.tolist(), lengths.tolist(), float(lengths[0])  # (fast to read)
    while heap:
        # the least run time needed once one more slot is dropped
        fewest = len(end_of) - 1 - (singles > 0)
        if covered - shortest < run_s + (fewest if fewest > 0 else 0) * checkpoint_s - 1e-6:
            break
        entry = heapq.heappop(heap)
        i = entry[1]
        if i in end_of:  # (its piece, and _fits inlined)
            a, b = i, end_of[i]
        elif i in start_of:
            a, b = start_of[i], i
        else:
            continue  # dropped already, or no longer an edge
        left = sums[b + 1] - sums[a] + (first_s if a == 0 else 0.0) - secs[i]
        if not (left >= min_len - 1e-6 or left <= 0):
            continue
        drops = len(end_of) - 1 - (a == b)
        if covered - secs[i] < run_s + (drops if drops > 0 else 0) * checkpoint_s - 1e-6:
            refused.append(entry)
            continue
        mask[i] = False
        covered -= float(lengths[i])
        del end_of[a], start_of[b]
        if a == b:
            singles -= 1
            for entry in refused if checkpoint_s > 0 else ():
                heapq.heappush(heap, entry)
            refused.clear()
            continue
        # its new edge; the other is in the heap still, or was refused: by the cover (then
        # in ``refused``) or by its piece's size, which only shrank, unless to one slot:
        # then the new edge is that slot
        a, b, new = (a + 1, b, a + 1) if i == a else (a, b - 1, b - 1)
        end_of[a], start_of[b] = b, a
        singles += a == b
        heapq.heappush(heap, (-float(price[new]), new))


def _trim(price, lengths, cum, pieces, surplus, min_len) -> tuple[int, bool]:
    """Where the surplus comes off: the dearest edge slot of a piece that stays at least
    ``min_len`` long (else of the longest piece), never the start of the first slot (now,
    or the job's release); True when at the piece's end."""
    options = []
    for a, b in pieces:
        size = _size(cum, lengths, a, b)
        ok = size - surplus >= min_len - 1e-6
        options += [(not ok, -float(price[b]), -size, b, True)]
        if a > 0:  # a piece that starts now starts now: a later start would recede on replans
            options += [(not ok, -float(price[a]), -size, a, False)]
    _, _, _, i, at_end = min(options)
    return i, at_end


def _cost(price, lengths, cum, mask, run_s, min_len, checkpoint_s) -> float:
    """The price of ``mask``'s time, its surplus over the run time its pieces need (the
    job's and the restarts') trimmed; inf when the trim leaves a piece (of more than one)
    shorter than ``min_len``."""
    used = float(np.dot(price[mask], lengths[mask]))
    pieces = runs(mask)
    surplus = float(lengths[mask].sum()) - run_needed_s(run_s, checkpoint_s, len(pieces))
    if surplus > 1e-6:
        i, _ = _trim(price, lengths, cum, pieces, surplus, min_len)
        used -= float(price[i]) * surplus
        a, b = next(r for r in pieces if r[0] <= i <= r[1])
        if len(pieces) > 1 and _size(cum, lengths, a, b) - surplus < min_len - 1e-6:
            return np.inf
    return used
