"""The answers of ``executors.remote``'s verbs, checked on the daemon's side before use.

A server (or whatever answers in its name) may print anything: not JSON, a list, ``{}``,
strings where numbers belong. ``check`` accepts an answer only when every key the daemon
reads is there with its type, and raises ``ValueError`` naming the first that is not, so a
malformed answer is that node's error for the pass, never the daemon's end.
"""

from __future__ import annotations

import re
from typing import Any

NONE = type(None)
NUMBER = (int, float)
MONITOR = {"pid": int, "start_ticks": int}
CLAIM = re.compile(r"(abandoned|started \d+ \d+)\Z")
RUN = {
    "claim": (str, NONE),
    "job": (dict, NONE),
    "exit": (dict, str, NONE),  # "": there but not JSON; checked per attempt (poll_result)
    "monitor_alive": bool,
    "job_alive": bool,
    "progress": (str, NONE),
    "power": str,
    "power_exists": bool,
}
VERBS: dict[str, dict[str, Any]] = {
    "launch": {"monitor": dict, "run_dir": str, "log_path": str},
    "status": {"runs": list},
    "signal": {"sent": bool},
    "fence": {"settled": bool, "ran": bool},
    "claim": {"claimed": bool, "claim": (str, NONE), "run_dir": str, "log_path": (str, NONE)},
}


def _fields(where: str, data: Any, required: dict, optional: dict | None = None) -> dict:
    if not isinstance(data, dict):
        raise ValueError(f"{where} is {type(data).__name__}, not an object")
    for key, kinds in [*required.items(), *(optional or {}).items()]:
        if key not in data:
            if key in required:
                raise ValueError(f"{where} has no {key!r}")
            continue
        value = data[key]
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        bool_ok = bool in kinds
        if not isinstance(value, kinds) or (isinstance(value, bool) and not bool_ok):
            raise ValueError(f"{where}[{key!r}] is {type(value).__name__}")
    return data


def check_run(data: Any, i: int = 0) -> dict:
    """One attempt's part of a ``status`` answer. What the server read from files a job
    may write (``exit``, ``job``) is checked where it is used, per attempt
    (``local.poll_result``, the mirror of ``job.json``): one job's forged file makes that
    attempt lost, not every attempt on its node unreachable."""
    return _fields(f"runs[{i}]", data, RUN)


def check(verb: str, data: Any) -> dict:
    """``data`` when it is a well-formed answer to ``verb``; else ``ValueError``."""
    answer = _fields(verb, data, VERBS.get(verb, {}))
    if verb == "launch":
        _fields("monitor", answer["monitor"], MONITOR)
    elif verb == "status":
        for i, run in enumerate(answer["runs"]):
            check_run(run, i)
    elif verb == "claim" and answer["claim"] is not None and not CLAIM.match(answer["claim"]):
        raise ValueError(f"claim is {answer['claim'][:40]!r}")
    return answer
