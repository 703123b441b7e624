"""Who owns what: the submitting user of each job, who may change it, and the file
permissions of the queue's home (private unless ``shared_group`` names a group)."""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import ConfigError, PermissionDenied
from orchestrator.models import Job
from orchestrator.settings import Settings


@dataclass(frozen=True)
class User:
    name: str
    uid: int

    @property
    def is_root(self) -> bool:
        return self.uid == 0


def current_user() -> User:
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return User(name=name, uid=uid)


def check_may_change(job: Job, user: User) -> None:
    if not user.is_root and job.uid != user.uid:
        raise PermissionDenied(
            f"job {job.id} belongs to {job.user}; only they or root may change it"
        )


@dataclass(frozen=True)
class HomeLayout:
    """Modes and group for files under GRIDSHIFT_HOME."""

    gid: int | None
    dir_mode: int
    file_mode: int
    log_gid: int | None


def home_layout(settings: Settings) -> HomeLayout:
    if settings.shared_group is None:
        return HomeLayout(gid=None, dir_mode=0o700, file_mode=0o600, log_gid=None)
    try:
        gid = grp.getgrnam(settings.shared_group).gr_gid
    except KeyError:
        raise ConfigError(
            f"shared_group {settings.shared_group!r} is not a group on this machine"
        ) from None
    return HomeLayout(gid=gid, dir_mode=0o2770, file_mode=0o660, log_gid=gid)


def prepare_home(settings: Settings) -> HomeLayout:
    """Create home, logs and run directories with the layout's permissions."""
    layout = home_layout(settings)
    for path in (settings.home, settings.logs_dir):
        _make_dir(path, layout.dir_mode, layout.gid)
    # traversable, not listable: jobs reach their progress file; spec files stay 0600
    _make_dir(settings.runs_dir, 0o711, None)
    return layout


def _make_dir(path: Path, mode: int, gid: int | None) -> None:
    """Create ``path`` with ``mode`` (and group). An existing directory is left as it is:
    gridshift never narrows the permissions of a folder it did not create."""
    if path.is_dir():
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        if gid is not None:
            os.chown(path, -1, gid)
        os.chmod(path, mode)  # mkdir's mode is narrowed by the umask
    except PermissionError as exc:
        raise ConfigError(f"cannot prepare {path}: {exc.strerror}") from None
