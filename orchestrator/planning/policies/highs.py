"""A HiGHS instance that prints nothing (``optimal`` and ``oracle`` solve with it)."""

from __future__ import annotations

import os
import sys
import threading

_BANNER_LOCK = threading.Lock()
_banner_done = False


def quiet_highs():
    """A silent HiGHS instance. The first one of a process prints HiGHS's banner to the
    C-level stdout before any option can be set, which broke ``simulate --json``: that
    first construction runs with file descriptor 1 on /dev/null."""
    import highspy

    global _banner_done
    with _BANNER_LOCK:
        if _banner_done:
            h = highspy.Highs()
        else:
            sys.stdout.flush()
            saved = os.dup(1)
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, 1)
                h = highspy.Highs()
            finally:
                os.dup2(saved, 1)
                os.close(saved)
                os.close(devnull)
            _banner_done = True
    h.setOptionValue("output_flag", False)
    return h
