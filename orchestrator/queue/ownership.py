"""Who owns what: the submitting user of each job, who may change it, and the file
permissions of the queue's home (private unless ``shared_group`` names a group; then the
daemon's, which only it writes)."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import ConfigError, PermissionDenied
from orchestrator.queue.models import Job
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
    """Modes and group for files under GRIDSHIFT_HOME.

    Single-user (no ``shared_group``): home and logs 0700, run directories 0711, every
    file 0600, all the user's own. Shared (``shared_group`` set, the daemon runs as root):
    home, logs and run directories owned by the daemon's user, group ``shared_group``,
    mode 0710 (its members may pass through, to their own log and progress file; no one
    but the daemon writes or lists them); the database 0600; each log 0600 and owned by
    its job's user (created by the monitor, see ``executors.runfiles.open_log``)."""

    gid: int | None
    dir_mode: int
    file_mode: int
    log_gid: int | None  # no longer used: a log is its owner's alone (0600)
    shared: bool = False


def home_layout(settings: Settings) -> HomeLayout:
    if settings.shared_group is None:
        return HomeLayout(gid=None, dir_mode=0o700, file_mode=0o600, log_gid=None)
    try:
        gid = grp.getgrnam(settings.shared_group).gr_gid
    except KeyError:
        raise ConfigError(
            f"shared_group {settings.shared_group!r} is not a group on this machine"
        ) from None
    # the daemon's alone: members reach the queue through its socket (and their own logs
    # through logs/), never by writing or listing these directories
    return HomeLayout(gid=gid, dir_mode=0o710, file_mode=0o600, log_gid=None, shared=True)


def prepare_home(settings: Settings) -> HomeLayout:
    """Create home, logs and run directories with the layout's permissions. In shared
    mode, check the ones that exist (see ``_own_dir``)."""
    layout = home_layout(settings)
    if layout.shared:
        for path in (settings.home, settings.logs_dir, settings.runs_dir):
            _own_dir(path, layout.dir_mode, layout.gid)
        return layout
    for path in (settings.home, settings.logs_dir):
        _make_dir(path, layout.dir_mode, layout.gid)
    # traversable, not listable: jobs reach their progress file; spec files stay 0600
    _make_dir(settings.runs_dir, 0o711, None)
    return layout


def _own_dir(path: Path, mode: int, gid: int | None) -> None:
    """Shared mode: a directory only the daemon's user (root) writes. A missing one is
    created and its group and mode set on its descriptor. An existing one must be a real
    directory (no link), owned by root or by this user (root, for the daemon) and
    writable by no one else; otherwise this refuses with one line and changes nothing:
    a directory users could write may hold what they planted, which a silent chmod would
    hide, so the administrator looks at it first."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:  # not a member of the group: no way through the home
        raise ConfigError(f"cannot reach {path}: {exc.strerror}") from None
    if st is None:
        st = _create_dir(path, mode, gid)
    owners = {os.geteuid(), 0}
    why = None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        why = "is a symbolic link or not a directory"
    elif st.st_uid not in owners:
        why = f"belongs to uid {st.st_uid}, not to the daemon's user (uid {min(owners)})"
    elif st.st_mode & 0o022:
        why = f"may be written by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    if why is not None:
        raise ConfigError(
            f"shared queue: {path} {why}; in shared mode only the daemon's user writes it "
            f"(check what is inside, then: chown root {path} && chmod {mode:o} {path})"
        )


def _make_dir(path: Path, mode: int, gid: int | None) -> None:
    """Create ``path`` with ``mode`` (and group). An existing directory is left as it is:
    gridshift never narrows the permissions of a folder it did not create."""
    if not path.is_dir():
        _create_dir(path, mode, gid)


def _create_dir(path: Path, mode: int, gid: int | None) -> os.stat_result:
    """mkdir, then group and mode (which the umask narrowed) set on the new directory's
    descriptor, never on a path; its stat."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # made meanwhile: checked as found
            os.mkdir(path, 0o700)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigError(f"cannot prepare {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid():  # ours, not one swapped in
            if gid is not None:
                os.fchown(fd, -1, gid)
            os.fchmod(fd, mode)
            st = os.fstat(fd)
    except PermissionError as exc:
        raise ConfigError(f"cannot prepare {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    return st
