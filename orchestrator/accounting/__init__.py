"""Accounting: what attempts used (energy from power logs, carbon and cost over the run),
what the daemon learns from runs (calibration) and the reports made from it.

May import: the root, ``queue`` and ``planning`` (budgets, models), and ``executors``' run
files. Not ``daemon``, ``nodes``, ``sim`` or ``cli``.
"""
