"""The pieces of a job that may be suspended, worth their checkpoints.

A job run in pieces checkpoints at the end of each but the last and restarts at the start
of each but the first; a restart loses about ``checkpoint_s`` of run time (saving the state,
loading it again, warming up). From the slots the cheapest selection took, ``settle`` keeps
no piece shorter than ``min_piece_s`` (a short piece's slots go to its neighbours' edges),
fills a gap between two pieces when what the gap saves is less than a restart, and prices
each restart at ``checkpoint_s`` of the job's run in the slot it restarts in.
"""

from __future__ import annotations

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
    mask = _lengthen(price, lengths, mask.copy(), run_s, min_len)
    if mask is None:
        return None
    best = _cost(price, lengths, mask, run_s, min_len, checkpoint_s)
    while len(runs(mask)) > 1:  # fill the gap whose filling saves most, while any does
        pieces = runs(mask)
        trials = []
        for (_, b), (a, _) in itertools.pairwise(pieces):
            trial = mask.copy()
            trial[b + 1 : a] = True
            if not np.isfinite(price[trial]).all():
                continue
            trial = _shed(price, lengths, trial, run_s, min_len)
            trials.append((_cost(price, lengths, trial, run_s, min_len, checkpoint_s), trial))
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
) -> tuple[tuple[float, float], ...]:
    """The (start, end) pieces of ``mask``, its surplus over ``run_s`` trimmed where
    ``_trim`` says."""
    ends = starts + lengths
    out = [[float(starts[a]), float(ends[b])] for a, b in runs(mask)]
    surplus = float(lengths[mask].sum()) - run_s
    if surplus > 1e-6:
        i, at_end = _trim(price, lengths, mask, surplus, min(min_piece_s, run_s))
        piece = next(k for k, (a, b) in enumerate(runs(mask)) if a <= i <= b)
        if at_end:
            out[piece][1] -= surplus
        else:
            out[piece][0] += surplus
    return tuple((a, b) for a, b in out)


def _lengthen(price, lengths, mask, run_s, min_len):
    """Drop the shortest piece under ``min_len`` and add its time at the cheapest edges of
    the others, until none is short."""
    while True:
        pieces = runs(mask)
        if len(pieces) <= 1:
            return mask
        sizes = [float(lengths[a : b + 1].sum()) for a, b in pieces]
        short = [k for k, n in enumerate(sizes) if n < min_len - 1e-6]
        if not short:
            return mask
        a, b = pieces[min(short, key=lambda k: (sizes[k], k))]
        mask[a : b + 1] = False
        while float(lengths[mask].sum()) < run_s - 1e-6:
            edge = np.zeros_like(mask)
            edge[1:] |= mask[:-1]
            edge[:-1] |= mask[1:]
            cand = np.flatnonzero(edge & ~mask & np.isfinite(price))
            if not len(cand):
                return None
            mask[int(cand[np.argmin(price[cand])])] = True


def _shed(price, lengths, mask, run_s, min_len):
    """Drop the dearest edge slots while the rest still covers ``run_s`` and no piece
    falls under ``min_len``. (The pieces are found once and kept up to date: a dropped
    edge slot shortens its piece, or removes it.)"""
    mask = mask.copy()
    pieces = runs(mask)
    while True:
        covered = float(lengths[mask].sum())
        best = None  # ((-price, slot), piece)
        for k, (a, b) in enumerate(pieces):
            size = float(lengths[a : b + 1].sum())
            for i in {a, b}:
                left = size - float(lengths[i])
                if covered - lengths[i] >= run_s - 1e-6 and (left >= min_len - 1e-6 or left <= 0):
                    key = (-float(price[i]), i)
                    if best is None or key < best[0]:
                        best = (key, k)
        if best is None:
            return mask
        (_, i), k = best
        mask[i] = False
        a, b = pieces[k]
        if a == b:
            del pieces[k]
        else:
            pieces[k] = (a + 1, b) if i == a else (a, b - 1)


def _trim(price, lengths, mask, surplus, min_len) -> tuple[int, bool]:
    """Where the surplus comes off: the dearest edge slot of a piece that stays at least
    ``min_len`` long (else of the longest piece), never the start of the first slot (now,
    or the job's release); True when at the piece's end."""
    options = []
    for a, b in runs(mask):
        size = float(lengths[a : b + 1].sum())
        ok = size - surplus >= min_len - 1e-6
        options += [(not ok, -float(price[b]), -size, b, True)]
        if a > 0:  # a piece that starts now starts now: a later start would recede on replans
            options += [(not ok, -float(price[a]), -size, a, False)]
    _, _, _, i, at_end = min(options)
    return i, at_end


def _cost(price, lengths, mask, run_s, min_len, checkpoint_s) -> float:
    """The price of ``mask``'s time, its surplus trimmed, and of its restarts; inf when
    the trim leaves a piece (of more than one) shorter than ``min_len``."""
    used = float(np.dot(price[mask], lengths[mask]))
    surplus = float(lengths[mask].sum()) - run_s
    pieces = runs(mask)
    if surplus > 1e-6:
        i, _ = _trim(price, lengths, mask, surplus, min_len)
        used -= float(price[i]) * surplus
        a, b = next(r for r in pieces if r[0] <= i <= r[1])
        if len(pieces) > 1 and float(lengths[a : b + 1].sum()) - surplus < min_len - 1e-6:
            return np.inf
    restarts = [a for a, _ in pieces[1:]]
    return used + checkpoint_s * float(price[restarts].sum())
