"""The daemon: the live loop over the queue.

The service (lock or lease, APScheduler timers, the pass), the pass's live side (the
queue's state in the SQL store for ``planning.onepass``, the dispatcher's launch and
resume, the reaper, suspensions and the guard's checkpoints), the live planner, the
PostgreSQL lease, the health row, Prometheus metrics and the hand-over of plans to Slurm.

May import: every room but ``sim`` and ``cli``.
"""
