"""Whether a file the root daemon runs or reads its power commands from is root's alone:
owned by root and not group/other-writable, nor any folder above it (a sticky folder
such as /tmp excepted: others cannot replace what root owns there), the path as written
and the file it leads to. Only checked when running as root: a user's own daemon runs
what its user may write anyway."""

from __future__ import annotations

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
