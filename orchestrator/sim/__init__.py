"""The what-if simulator: replay a job trace against a grid trace under each policy.

It runs the same planning code as the daemon (``planning``) on simulated time, with the
simulated executor. May import: the root, ``queue`` (job specs of traces), ``planning``,
``signals`` and the leaves. Not ``daemon``, ``nodes``, ``accounting`` or ``cli``.
"""
