"""What one what-if run of one policy produced: each job's first start and finish, the
power segments the simulated executor recorded, and the run's counters."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.planning.budgets import Ledger
from orchestrator.sim.hardware.power import IdleAccount


@dataclass
class RunResult:
    policy: str
    forecast: str
    first_start_s: np.ndarray
    finish_s: np.ndarray
    seg_start_s: np.ndarray
    seg_end_s: np.ndarray
    seg_power_w: np.ndarray
    seg_gpus: np.ndarray
    suspensions: int
    fragmentation: float  # mean share of the cluster free but unusable by a waiting job
    ticks: int
    forced: int = 0  # starts a deadline forced against the budget or the objective
    guard_suspensions: int = 0  # jobs the deadline guard suspended to make room
    replans: int = 0
    ledger: Ledger | None = None
    solver: dict | None = None  # what the oracle's solve reported
    idle: IdleAccount | None = None  # idle GPUs and servers on (sim.hardware.power)
    pairs: list | None = None  # co-location: (job, partner, when) pairs formed
    moves: int = 0  # co-location: jobs checkpointed to join another (sim.hardware.colocation)
    splits: int = 0  # co-location: jobs of a pair checkpointed to keep a deadline (alone)
