"""Signals: the orchestrator's door to ``grid/``.

Building grid sources from settings (with the cache) and the live signal feed the daemon
plans on (refresh, fallback, age), and what logs and terminals may be shown of them
(``redact``: providers' keys and passwords hidden, control characters escaped; the CLI
and the daemon both use it).

May import: the root and ``grid``. Not ``queue``, ``planning``, ``daemon``, ``sim``, ``cli``.
"""
