"""What keeping a server on costs a job that waits: while a job is deferred, the GPUs it
will run on (and their share of the server) sit idle, drawing power that a plan starting
it now would not spend waiting. A planner comparing start slots adds, to each later start,
the idle draw of the job's GPUs over its wait, priced like its run (the objective per
watt-second: carbon, cost or the mix), for at most ``idle_wait_s`` of the wait (with
right-sizing, a node idle that long is powered off; what remains is its wake-up).

This is the cost of the idle GPUs the job leaves waiting; when other jobs would use them
meanwhile it is an upper bound. Pure, vectorised over the planner's options.
"""

from __future__ import annotations

import numpy as np


def wait_cost(
    series, release_s: np.ndarray, start_s: np.ndarray, idle_w: np.ndarray,
    idle_wait_s: float | None = None,
) -> np.ndarray:  # fmt: skip
    """``idle_w`` × the integral of ``series`` (per watt-second) over each option's wait,
    from its release to its start (or to ``idle_wait_s`` after the release at most).
    Arrays broadcast together; a start at its release costs nothing."""
    start = np.maximum(np.asarray(start_s, dtype=float), release_s)
    if idle_wait_s is not None:
        start = np.minimum(start, release_s + idle_wait_s)
    waited = series.integral(np.broadcast_to(release_s, start.shape), start)
    return idle_w * np.where(start > release_s, waited, 0.0)
