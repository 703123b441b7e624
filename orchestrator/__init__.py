"""gridshift's orchestrator: settings, store, job state machine, daemon and CLI. It
composes the leaf packages ``grid``, ``placement`` and ``executors``."""

__version__ = "0.1.0"
