"""How the daemon runs Slurm's commands, and what it hands ``sbatch``.

Slurm's commands (``sbatch``, ``squeue``, ``sacct``, ``scancel``, ``scontrol``) run by
absolute path, found once in the node's ``slurm_bin_dir`` or else in a fixed list of
system directories (never a job's or a user's ``PATH``), with an environment the daemon
builds: a fixed ``PATH``, ``LANG``, and ``SLURM_CONF`` and ``TZ`` from the daemon's own
environment. A job's environment never reaches ``sbatch`` (no ``LD_PRELOAD``, no
``SBATCH_*`` options in disguise): the job is submitted with ``--export=NONE`` and its
batch script, handed to ``sbatch`` on standard input, exports the job's variables itself.
A job of another user is submitted as that user (``sbatch`` runs with their uid, gid and
groups), so Slurm runs it, and accounts it, as its submitter.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from executors.errors import ExecutorError, HostUnreachable, LaunchError

COMMANDS = ("sbatch", "squeue", "sacct", "scancel", "scontrol")
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
SEARCH_DIRS = ("/usr/local/sbin", "/usr/local/bin", *SYSTEM_PATH.split(":"))
DAEMON_ENV = ("SLURM_CONF", "TZ")  # taken from the daemon's own environment, if set
UNREACHABLE_SIGNS = ("Unable to contact slurm controller", "Socket timed out",
                     "Connection refused", "Zero Bytes were transmitted")  # fmt: skip
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
JOB_DIR = "job"  # in the run directory: the only place a job may write (its progress)


def find(name: str, bin_dir: str | None = None) -> str | None:
    """The absolute path of one of Slurm's commands: in ``bin_dir`` when given, else in
    the system directories; None when it is not there."""
    for d in [bin_dir] if bin_dir else SEARCH_DIRS:
        path = os.path.join(d, name)
        if os.path.isabs(path) and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def missing(bin_dir: str | None = None) -> list[str]:
    return [name for name in COMMANDS if find(name, bin_dir) is None]


def command_env() -> dict[str, str]:
    """The environment Slurm's commands get: built here, never a job's."""
    env = {"PATH": SYSTEM_PATH, "LANG": os.environ.get("LANG") or "C.UTF-8"}
    env.update({k: os.environ[k] for k in DAEMON_ENV if os.environ.get(k)})
    return env


@dataclass(frozen=True)
class RunAs:
    """The user a command runs as (the job's submitter)."""

    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def of(cls, uid: int | None, gid: int | None = None) -> RunAs | None:
        """None when the command runs as the daemon itself."""
        if uid is None or uid == os.geteuid():
            return None
        if os.geteuid() != 0:
            raise LaunchError(f"cannot submit as uid {uid}: the daemon does not run as root")
        try:
            pw = pwd.getpwuid(uid)
        except KeyError:
            raise LaunchError(f"uid {uid} is not a user on this host") from None
        gid = pw.pw_gid if gid is None else gid
        return cls(uid, gid, tuple(os.getgrouplist(pw.pw_name, gid)))


class Commands:
    """Slurm's commands, found once."""

    def __init__(self, bin_dir: str | None = None, timeout_s: float = 30.0) -> None:
        self.bin_dir = bin_dir
        self.timeout_s = timeout_s
        self.paths = {name: find(name, bin_dir) for name in COMMANDS}

    def run(self, name: str, *args: str, check: bool = True, stdin: str | None = None,
            as_user: RunAs | None = None) -> subprocess.CompletedProcess:  # fmt: skip
        path = self.paths.get(name)
        if path is None:
            where = self.bin_dir or ", ".join(SEARCH_DIRS)
            raise ExecutorError(f"{name} not found in {where}: is Slurm's client installed?")
        user = {}
        if as_user is not None:
            user = {"user": as_user.uid, "group": as_user.gid,
                    "extra_groups": list(as_user.groups)}  # fmt: skip
        try:
            proc = subprocess.run(
                [path, *args], capture_output=True, text=True, timeout=self.timeout_s,
                env=command_env(), cwd="/", input=stdin,
                stdin=None if stdin is not None else subprocess.DEVNULL, **user,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise HostUnreachable(f"{name} did not answer in {self.timeout_s:g}s") from None
        except OSError as exc:
            raise ExecutorError(f"cannot run {path}: {exc}") from None
        if check and proc.returncode != 0:
            why = " ".join(proc.stderr.split()) or f"exit {proc.returncode}"
            # the controller is away: the job's fate is unknown, not failed
            gone = any(s in why for s in UNREACHABLE_SIGNS)
            raise (HostUnreachable if gone else ExecutorError)(f"{name}: {why}")
        return proc


def batch_script(
    command: list[str], env: dict[str, str], nodes: int = 1, srun: str = "srun"
) -> str:
    """The batch script: it exports the job's environment (Slurm's own ``SLURM_*``
    values win over stale ones a submitter's shell held), then ``exec``s the command, so
    the job is the batch step."""
    lines = ["#!/bin/sh", "# gridshift: one attempt of one job"]
    for key, value in sorted(env.items()):
        if NAME.match(key) and not key.startswith("SLURM_"):
            lines.append(f"export {key}={shlex.quote(value)}")
    lines.append("export SLURM_EXPORT_ENV=ALL")  # srun steps inside get the job's env
    if nodes > 1:  # one process per machine, each told its rank; one failing ends them all
        lines.append("exec " + shlex.join([srun, f"--nodes={nodes}", "--ntasks-per-node=1",
                                           "--kill-on-bad-exit=1", "sh", "-c", PART, "part",
                                           *command]))  # fmt: skip
    else:
        lines.append("exec " + shlex.join(command))
    return "\n".join(lines) + "\n"


#: Each machine's process of a job across machines: the rendezvous from Slurm's values
#: (rank 0 runs where the batch script runs, which launched the step).
PART = (
    'export MASTER_ADDR="$SLURM_LAUNCH_NODE_IPADDR" NODE_RANK="$SLURM_NODEID" '
    'NPROC_PER_NODE="${SLURM_GPUS_ON_NODE:-0}"; exec "$@"'
)


def _open_own(path: Path, flags: int, uid: int, gid: int, mode: int) -> None:
    """Create ``path`` (or take the one this daemon created before), never through a
    link, and hand it to ``uid`` through its descriptor."""
    base = flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    is_dir = bool(flags & os.O_DIRECTORY)
    try:
        if is_dir:
            os.mkdir(path, mode)
            fd, created = os.open(path, base), True
        else:
            fd, created = os.open(path, base | os.O_CREAT | os.O_EXCL, mode), True
    except FileExistsError:
        fd, created = os.open(path, base), False
    try:
        st = os.fstat(fd)
        kind_ok = stat.S_ISDIR(st.st_mode) if is_dir else stat.S_ISREG(st.st_mode)
        if not kind_ok or (not created and st.st_uid not in (uid, os.geteuid())):
            raise LaunchError(f"{path} is not what this daemon made: refusing to use it")
        if not is_dir and st.st_nlink != 1:
            raise LaunchError(f"{path} has other links: refusing to use it")
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def prepare_user_files(run_dir: Path, log_path: Path, who: RunAs) -> Path:
    """For a job that runs as another user: its log (created here, then theirs, 0600;
    Slurm opens it as them) and a directory of theirs for its progress report, apart
    from the files the daemon keeps. Returns that directory."""
    try:
        _open_own(log_path, os.O_WRONLY | os.O_APPEND, who.uid, who.gid, 0o600)
        job_dir = run_dir / JOB_DIR
        _open_own(job_dir, os.O_RDONLY | os.O_DIRECTORY, who.uid, who.gid, 0o700)
    except OSError as exc:
        raise LaunchError(f"cannot prepare the job's files: {exc}") from exc
    return job_dir


def read_small(path: Path, limit: int = 4096) -> str | None:
    """A file a job may write (its progress), read without following links or
    blocking on a FIFO; None unless it is a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode(errors="replace")
    finally:
        os.close(fd)
