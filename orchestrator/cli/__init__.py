"""The ``gridshift`` command line: one module per verb, wired together in ``app``."""
