"""Files in an attempt's run directory: the contract between executor and monitor.

``spec.json`` (written before the monitor starts, removed by the monitor as soon as it has
read it: it holds the job's environment), ``claim`` (created exactly once, with O_EXCL:
either by the monitor, ``started <pid> <ticks>``, or by a recovering daemon,
``abandoned``), ``job.json`` (the job's pid and start time) and ``exit.json`` (exit code,
end time, energy) and ``power.log`` (energy samples over the run, where GPUs count it).
JSON files are written to a temporary name, synced, then renamed.

The run directory belongs to whoever runs the monitor (root on a shared server) and no
one else can write it; the job, which may run as another user, owns one file there:
``progress``, created by the monitor and handed to the job's user. That file, and the
job's log, are untrusted input: read without following links, at most
``PROGRESS_MAX`` bytes, parsed strictly.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import stat
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

SPEC, CLAIM, JOB, EXIT, PROGRESS = "spec.json", "claim", "job.json", "exit.json", "progress"
POWER = "power.log"
RECORDS = (SPEC, CLAIM, JOB, EXIT, PROGRESS, POWER)  # what one attempt's run leaves
PROGRESS_MAX = 4096  # bytes of a progress report that are read; a longer one is garbage
_UNTRUSTED = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC  # never block
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def make_dir(path: Path, mode: int) -> None:
    """Create ``path`` (or take the one this user made before) as a directory of this
    user's: never through a symbolic link, never one another user owns or may write; its
    mode is set on the open directory, not on the path."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise OSError(exc.errno, "a symbolic link or not a directory", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise OSError(errno.EPERM, "another user owns or may write it", str(path))
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def create_owned(path: Path, uid: int | None, gid: int | None, flags: int = 0) -> int:
    """A new file (never an existing one, never through a link), handed to ``uid`` (when
    this is root and it is another user) with mode 0600 on its descriptor; the descriptor
    is returned, open for writing with ``flags`` added."""
    fd = os.open(path, _NEW | flags, 0o600)
    try:
        if uid is not None and uid != os.geteuid() and os.geteuid() == 0:
            os.fchown(fd, uid, -1 if gid is None else gid)
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd


def open_log(path: Path, uid: int | None, gid: int | None) -> int:
    """The job's log, for appending. A new log is created here and handed to the job's
    user (``create_owned``); the log of an earlier attempt of the same job is appended to
    when it is a plain file of that user's with one link, and refused otherwise."""
    try:
        return create_owned(path, uid, gid, os.O_APPEND | os.O_NOCTTY)
    except FileExistsError:
        pass
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
    fd = os.open(path, flags | os.O_NONBLOCK)  # a FIFO there must not stall the monitor
    st = os.fstat(fd)
    owner = os.geteuid() if uid is None else uid
    if not stat.S_ISREG(st.st_mode) or st.st_uid != owner or st.st_nlink != 1:
        os.close(fd)
        raise OSError(errno.EPERM, "not a plain file of the job's user with one link", str(path))
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def write_json(path: Path, data: dict[str, Any], mode: int = 0o600) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    remove(tmp)  # a leftover of a crashed writer with this pid
    fd = os.open(tmp, _NEW, mode)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


JSON_MAX = 1 << 16  # bytes of a run file's JSON that are read; a longer one is garbage


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from a run file; None when it is absent or not one (unreadable,
    not a plain file, longer than ``JSON_MAX``, not JSON, not an object, nested too
    deep). The files a job may write are checked further by ``check_exit``/``check_job``."""
    try:
        fd = os.open(path, os.O_RDONLY | _UNTRUSTED)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, JSON_MAX + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > JSON_MAX:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeError are ValueErrors
        return None
    return data if isinstance(data, dict) else None


def try_claim(run_dir: Path, text: str) -> bool:
    """Create the claim file holding ``text``, atomically with its content (a finished
    temporary file is hard-linked into place). False when someone claimed first."""
    tmp = run_dir / f".claim.{os.getpid()}.tmp"
    remove(tmp)
    fd = os.open(tmp, _NEW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        os.link(tmp, run_dir / CLAIM)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def read_claim(run_dir: Path) -> str | None:
    try:
        return (run_dir / CLAIM).read_text()
    except FileNotFoundError:
        return None


def read_progress(run_dir: Path) -> str | None:
    """The job's progress report as it stands: at most ``PROGRESS_MAX`` bytes of a plain
    file (never through a link, never a FIFO or device); None when there is none."""
    try:
        fd = os.open(run_dir / PROGRESS, os.O_RDONLY | _UNTRUSTED)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, PROGRESS_MAX + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace") if len(data) <= PROGRESS_MAX else None


def _number(value: Any, text: bool = False) -> float:
    """A finite number: a JSON number (not a boolean, not a string), or a word of text."""
    if isinstance(value, bool) or not isinstance(value, str if text else (int, float)):
        raise TypeError("not a number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError("not finite")
    return number


def parse_progress(text: str) -> tuple[float, float | None] | None:
    """A job's progress report: ``"DONE TOTAL"``, ``"DONE/TOTAL"``, ``"DONE"`` or JSON
    ``{"done": D, "total": T}``. None when it is empty or unreadable (a job may be in the
    middle of writing it) or not believable: more than ``PROGRESS_MAX`` bytes, numbers
    that are not finite, a negative done, a total not above zero or below done."""
    text = text.strip()
    if not text or len(text) > PROGRESS_MAX:
        return None
    try:
        if text.startswith("{"):
            data = json.loads(text)
            if not isinstance(data, dict):
                return None
            done, total = _number(data["done"]), data.get("total")
            total = None if total is None else _number(total)
        else:
            parts = text.replace("/", " ").split()
            if len(parts) > 2:
                return None
            done = _number(parts[0], text=True)
            total = _number(parts[1], text=True) if len(parts) > 1 else None
    except (ValueError, KeyError, TypeError, IndexError, RecursionError):
        return None
    if done < 0 or (total is not None and (total <= 0 or done > total)):
        return None
    return done, total


# -- the files a job may forge: checked field by field ----------------------------------
EXIT_CODE_MAX = 255  # a shell's exit status: 0..255 (128 + N for signal N)
SIGNAL_MAX = 64  # SIGRTMAX on Linux
PID_MAX = 1 << 22  # the kernel's pid_max ceiling
DETAIL_MAX = 500  # characters of an exit record's detail that are kept
POWER_CHUNK = 1 << 20  # bytes of a power log read at once


class BadRunFile(ValueError):
    """A run file that is there but cannot be believed (wrong types, out of range)."""


def _int(data: dict, key: str, low: int, high: int, *, optional: bool = False) -> int | None:
    value = data.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRunFile(f"{key} is {_shown(value)}, not an integer in {low}..{high}")
    return value


def _time(data: dict, key: str) -> datetime:
    value = data.get(key)
    if not isinstance(value, str) or len(value) > 64:
        raise BadRunFile(f"{key} is {_shown(value)}, not a time")
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise BadRunFile(f"{key} is {_shown(value)}, not a time") from None
    if at.tzinfo is None:
        raise BadRunFile(f"{key} is {_shown(value)}, a time without its zone")
    try:
        return at.astimezone(timezone.utc)
    except (OverflowError, ValueError):
        raise BadRunFile(f"{key} is {_shown(value)}, out of range") from None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_exit(data: Any) -> dict[str, Any]:
    """An exit record (``exit.json``) as the monitor writes it: ``exit_code`` an integer
    0..255, ``signal`` null or 1..64, ``ended_at`` an ISO time with its zone (returned
    as a UTC datetime), ``energy_j`` null or a finite number not below zero, ``detail``
    null or text (cut to ``DETAIL_MAX``). ``BadRunFile`` names the first field that is
    not."""
    if not isinstance(data, dict):
        raise BadRunFile("not a JSON object")
    code = _int(data, "exit_code", 0, EXIT_CODE_MAX)
    sig = _int(data, "signal", 1, SIGNAL_MAX, optional=True)
    ended_at = _time(data, "ended_at")
    energy = data.get("energy_j")
    if energy is not None:
        try:
            energy = _number(energy)
        except (TypeError, ValueError):
            raise BadRunFile(f"energy_j is {_shown(energy)}, not a finite number") from None
        if energy < 0:
            raise BadRunFile(f"energy_j is {_shown(energy)}, below zero")
    detail = data.get("detail")
    if detail is not None and not isinstance(detail, str):
        raise BadRunFile(f"detail is {_shown(detail)}, not text")
    if detail is not None:
        detail = detail.replace("\x00", "")[:DETAIL_MAX]
    return {"exit_code": code, "signal": sig, "ended_at": ended_at, "energy_j": energy,
            "detail": detail}  # fmt: skip


def check_job(data: Any) -> dict[str, Any]:
    """A start record (``job.json``): ``pid`` an integer 2..pid_max (null where a batch
    scheduler runs the job), ``start_ticks`` an integer not below zero, ``started_at`` an
    ISO time with its zone (returned as a UTC datetime). ``BadRunFile`` names the first
    field that is not."""
    if not isinstance(data, dict):
        raise BadRunFile("not a JSON object")
    pid = _int(data, "pid", 2, PID_MAX, optional="slurm_job_id" in data)
    ticks = _int(data, "start_ticks", 0, 1 << 62, optional=pid is None)
    return {**data, "pid": pid, "start_ticks": ticks, "started_at": _time(data, "started_at")}


def started_at(data: Any) -> datetime:
    """The ``started_at`` of a start record (``job.json``), as a UTC datetime;
    ``BadRunFile`` when there is no believable one."""
    if not isinstance(data, dict):
        raise BadRunFile("job.json is not a JSON object")
    return _time(data, "started_at")


def read_exit(run_dir: Path) -> dict[str, Any] | None:
    """The checked exit record; None when there is none; ``BadRunFile`` when there is
    one that cannot be believed (or read)."""
    return _read_checked(run_dir / EXIT, check_exit)


def read_job(run_dir: Path) -> dict[str, Any] | None:
    """The checked start record; None when there is none; ``BadRunFile`` as ``read_exit``."""
    return _read_checked(run_dir / JOB, check_job)


def _read_checked(path: Path, check) -> dict[str, Any] | None:
    if not os.path.lexists(path):
        return None
    data = read_json(path)
    if data is None:
        if not os.path.lexists(path):
            return None  # gone meanwhile
        raise BadRunFile(f"{path.name} is not a JSON object of at most {JSON_MAX} bytes")
    try:
        return check(data)
    except BadRunFile as exc:
        raise BadRunFile(f"{path.name}: {exc}") from None


def parse_power(data: bytes) -> list[tuple[float, float]]:
    """``power.log`` lines: ``<epoch s> <joules since start>``, both finite, not below
    zero. Any other line (garbage a job wrote, a torn line) is skipped."""
    samples = []
    for line in data.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        try:
            t, e = float(parts[0]), float(parts[1])
        except ValueError:
            continue
        if math.isfinite(t) and math.isfinite(e) and t >= 0 and e >= 0:
            samples.append((t, e))
    return samples


def read_power_log(
    path: Path, offset: int = 0, limit: int = POWER_CHUNK
) -> tuple[list[tuple[float, float]], int]:
    """Samples ``(t_s, joules since start)`` from byte ``offset`` on (at most ``limit``
    bytes), and the offset after the last whole line read (a line being written is left
    for the next read; a "line" longer than ``limit`` is skipped whole). Malformed lines
    are skipped (``parse_power``)."""
    try:
        fd = os.open(path, os.O_RDONLY | _UNTRUSTED)
    except OSError:
        return [], offset
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return [], offset
        data = os.pread(fd, limit, offset)
    except OSError:
        return [], offset
    finally:
        os.close(fd)
    end = data.rfind(b"\n") + 1
    if end == 0 and len(data) == limit:  # no line end in a whole chunk: garbage
        return [], offset + len(data)
    return parse_power(data[:end]), offset + end
