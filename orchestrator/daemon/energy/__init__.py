"""The daemon's energy levers on the live cluster: the site power limit split across
running jobs, right-sizing (powering idle servers down and waking them for a job) and
jobs sharing a GPU. Same import rules as ``orchestrator.daemon``.
"""
