"""Accounting: what attempts used (energy from power logs, carbon and cost over the run),
what the daemon learns from runs (calibration) and the reports made from it.

May import: the root, ``queue`` and ``planning`` (budgets, models), ``executors``' run
files, and ``signals.redact`` (figures draw users' text as it escapes it). Not
``daemon``, ``nodes``, ``sim`` or ``cli``.
"""
