"""Planning: the pure decision code shared by the live daemon and the what-if simulator.

Budgets and their ledger, performance and power models (and their fit), the scheduler
(plan, then launch in queue order), the pass's named steps, the pieces of a plan, the
snapshot builder and the policies. Everything here takes a snapshot and returns a
decision: no database, no wall clock, no settings, no network.

May import: ``orchestrator.errors``, ``orchestrator.timeparse``, the leaves (``grid``,
``placement``) and numpy/highspy. Never ``queue``, ``accounting``, ``nodes``, ``signals``,
``daemon``, ``sim``, ``cli`` or ``settings``: ``tests/test_codebase.py`` checks it.
"""
