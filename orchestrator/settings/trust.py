"""Whether a file the root daemon runs or reads its power commands from is root's alone:
owned by root and not group/other-writable, nor any folder above it (a sticky folder
such as /tmp excepted: others cannot replace what root owns there), the path as written
and the file it leads to. Only checked when running as root: a user's own daemon runs
what its user may write anyway."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def untrusted(path: str | Path) -> str | None:
    """Why ``path`` is not root's alone (None: it is, or this process is not root)."""
    if os.geteuid() != 0:
        return None
    given = Path(os.path.abspath(path))
    for place in dict.fromkeys([given, Path(os.path.realpath(given))]):
        try:
            why = _chain(place)
        except OSError as exc:
            return f"{place}: {exc.strerror or exc}"
        if why is not None:
            return why
    return None


def _chain(path: Path) -> str | None:
    st = os.stat(path)
    if st.st_uid != 0:
        return f"{path} is not owned by root"
    if st.st_mode & 0o022:
        return f"{path} is group- or other-writable"
    for folder in path.parents:
        st = os.stat(folder)
        if st.st_mode & stat.S_ISVTX:
            continue
        if st.st_uid != 0 or st.st_mode & 0o022:
            return f"{folder} (a folder above {path.name}) is writable by others than root"
    return None


def unrunnable(path: str) -> str | None:
    """Why the daemon could not run ``path`` as a program (None: it could): not there, not
    a regular file (a directory, a device), or not executable. As root (the daemon of a
    shared server), or for a program this user owns, it asks the kernel (``X_OK``); a
    member's CLI reading root's config, which may not see or run root's programs, only
    refuses what no one could run."""
    me = os.geteuid()
    try:
        st = os.stat(path)
    except OSError as exc:
        if me != 0 and exc.errno == errno.EACCES:
            return None  # root's daemon checks what it cannot see
        return f"{exc.strerror or exc}"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file" + (" (a directory)" if stat.S_ISDIR(st.st_mode) else "")
    mine = me == 0 or st.st_uid == me
    if not st.st_mode & 0o111 or (mine and not os.access(path, os.X_OK)):
        return "is not executable (no x permission for the daemon's user)"
    return None
