"""Throwaway Unix users and a group for the shared-server tests (root only).

``lab_users(tmp)`` creates a group and three users: ``alice`` and ``bob`` in the lab group,
``eve`` outside it, each with a private home under ``tmp``; they are removed afterwards
(``userdel``, ``groupdel``), also when the test fails. ``as_user(user, argv, ...)`` runs a
command as one of them (uid, gid and supplementary groups set by ``subprocess``), with a
clean environment of its own, so nothing of root's leaks into what the test measures.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class TestUser:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: Path


@dataclass(frozen=True)
class Lab:
    group: str
    gid: int
    alice: TestUser
    bob: TestUser
    eve: TestUser  # not in the lab group


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the shared-server tests create throwaway users")
    for tool in ("useradd", "groupadd", "userdel", "groupdel"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool} (Debian: passwd)")


@contextlib.contextmanager
def lab_users(tmp: Path) -> Iterator[Lab]:
    needs_root()
    tag = secrets.token_hex(3)
    group = f"gsl{tag}"
    made_users: list[str] = []
    subprocess.run(["groupadd", group], check=True, capture_output=True)
    try:
        users = {}
        for who, in_lab in (("alice", True), ("bob", True), ("eve", False)):
            name = f"gs{who[:3]}{tag}"
            home = tmp / name
            args = ["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/sh"]
            if in_lab:
                args += ["--groups", group]
            subprocess.run([*args, name], check=True, capture_output=True)
            made_users.append(name)
            pw = pwd.getpwnam(name)
            home.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chown(home, pw.pw_uid, pw.pw_gid)
            os.chmod(home, 0o700)
            groups = tuple(g.gr_gid for g in grp.getgrall() if name in g.gr_mem)
            users[who] = TestUser(name, pw.pw_uid, pw.pw_gid, (pw.pw_gid, *groups), home)
        yield Lab(group, grp.getgrnam(group).gr_gid, users["alice"], users["bob"], users["eve"])
    finally:
        for name in made_users:
            subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)


def as_user(
    user: TestUser,
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
    check: bool = False,
    **kwargs,
) -> subprocess.CompletedProcess:
    """Run ``argv`` as ``user`` with a clean environment (plus ``env``)."""
    base = {"HOME": str(user.home), "USER": user.name, "LOGNAME": user.name,
            "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}  # fmt: skip
    return subprocess.run(
        argv,
        env={**base, **(env or {})},
        cwd=cwd or user.home,
        user=user.uid,
        group=user.gid,
        extra_groups=list(user.groups),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
        **kwargs,
    )
