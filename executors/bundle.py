"""The part of ``executors`` a server needs: the job monitor and the remote verbs.

The SSH executor installs it once per server and version under
``<remote_dir>/lib/<hash>`` (the hash of the files: a new gridshift installs beside the
old one, whose running monitors keep theirs), from a tar archive sent on standard input
and unpacked by the server's ``python3`` (no ``tar`` or ``scp`` needed): first into a
temporary directory, then renamed into place, so a half-sent copy is never used.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from functools import lru_cache
from pathlib import Path

FILES = (
    "__init__.py",
    "errors.py",
    "gpu/__init__.py",
    "gpu/base.py",
    "gpu/smi.py",
    "procs.py",
    "remote.py",
    "runfiles.py",
    "shim.py",
)

# Runs as ``python3 -c INSTALL LIB_DIR`` with the archive on standard input.
INSTALL = """
import io, os, shutil, sys, tarfile, tempfile
lib = os.path.abspath(os.path.expanduser(sys.argv[1]))
if not os.path.exists(os.path.join(lib, ".complete")):
    parent = os.path.dirname(lib)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".install-")
    with tarfile.open(fileobj=io.BytesIO(sys.stdin.buffer.read())) as tar:
        for member in tar.getmembers():
            if not member.isfile() or member.name.startswith(("/", "..")) or ".." in member.name:
                sys.exit("bad member " + member.name)
        tar.extractall(tmp)
    open(os.path.join(tmp, ".complete"), "w").close()
    try:
        os.rename(tmp, lib)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
print(lib)
"""

# Runs as ``python3 -c PROBE LIB_DIR``: whether that version is installed already, and
# where it is (the absolute path).
PROBE = """
import os, sys
lib = os.path.abspath(os.path.expanduser(sys.argv[1]))
print(("present " if os.path.exists(os.path.join(lib, ".complete")) else "missing ") + lib)
"""


@lru_cache(maxsize=1)
def archive() -> tuple[str, bytes]:
    """(content hash, tar archive of ``executors/<FILES>``)."""
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in FILES:
            data = (here / name).read_bytes()
            digest.update(name.encode() + b"\0" + data)
            info = tarfile.TarInfo(f"executors/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return digest.hexdigest()[:16], buf.getvalue()
