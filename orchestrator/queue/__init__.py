"""The queue: the database and a job's life in it.

Holds the ORM models, the database handle, the job and attempt state machines
(``states``, ``attempts``), the store's queries, job specs, ownership and cron templates.

May import: the root (``orchestrator.errors``, ``clock``, ``settings``, ``timeparse``) and
the leaves' small types. Nothing of planning, accounting, nodes, signals, daemon, sim or cli.
"""
