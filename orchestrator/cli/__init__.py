"""The ``gridshift`` command line: one module per verb, wired together in ``app``.

Thin clients: they parse, ask the rooms and print. May import every room; nothing
imports them.
"""
