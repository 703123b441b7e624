"""What every request handler gets: the caller, the context and the request's arguments
(checked here, since a request may come from anyone in the group)."""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.api.protocol import ProtocolError
from orchestrator.errors import PermissionDenied, SpecError

if TYPE_CHECKING:
    from orchestrator.queue.ownership import User
    from orchestrator.settings import Settings


@dataclass(frozen=True)
class Caller:
    """Who asks: uid and gid from the kernel (``SO_PEERCRED``), groups from the user
    database."""

    name: str
    uid: int
    gids: tuple[int, ...] = ()

    @property
    def user(self) -> User:
        from orchestrator.queue.ownership import User

        return User(name=self.name, uid=self.uid)

    @classmethod
    def from_ids(cls, uid: int, gid: int) -> Caller:
        try:
            name = pwd.getpwuid(uid).pw_name
            gids = tuple(os.getgrouplist(name, gid))
        except KeyError:  # a uid without a name: its primary group only
            name, gids = str(uid), (gid,)
        return cls(name=name, uid=uid, gids=gids)

    @classmethod
    def this_process(cls) -> Caller:
        return cls.from_ids(os.getuid(), os.getgid())


@dataclass
class OpContext:
    settings: Settings
    open_db: Callable[[], Any]
    daemon_running: Callable[[], bool]
    owner_uid: int = field(default_factory=os.geteuid)  # the queue's owner: the daemon's user
    _db: Any = field(default=None, repr=False)

    @property
    def db(self):
        if self._db is None:
            self._db = self.open_db()
        return self._db

    @property
    def shared(self) -> bool:
        return self.settings.shared_group is not None

    def privileged(self, caller: Caller) -> bool:
        """Root and the daemon's own user: they see and may change every job."""
        return caller.uid in (0, self.owner_uid)


class Args:
    """A request's arguments, each read with its type checked."""

    def __init__(self, raw: dict) -> None:
        self.raw = raw

    def get(self, name: str, kind: type | tuple, default: Any = None) -> Any:
        value = self.raw.get(name)
        if value is None:
            return default
        if isinstance(value, bool) and kind in (int, float):
            value = "a boolean"
        if not isinstance(value, kind):
            raise ProtocolError(f"malformed request: {name} has the wrong type")
        if isinstance(value, int) and not isinstance(value, bool):
            _int64(name, value)
        return value

    def ints(self, name: str) -> list[int]:
        values = self.get(name, list, [])
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise ProtocolError(f"malformed request: {name} must be a list of integers")
        for value in values:
            _int64(name, value)
        return values


def _int64(name: str, value: int) -> None:
    """Integers the store can hold: 64 bits (an id beyond them names nothing)."""
    from orchestrator.queue.checks import INT64_MAX, INT64_MIN, shown

    if not INT64_MIN <= value <= INT64_MAX:
        raise ProtocolError(f"{name} {shown(value)} is out of range: at most {INT64_MAX}")


def check_source(ctx: OpContext, caller: Caller, spec: str | None) -> None:
    """A shared daemon (often root) reads no file a member names: a CSV trace given by
    anyone but root and the daemon's user is refused; the configured sources serve all."""
    if spec and ctx.shared and not ctx.privileged(caller):
        name = spec.partition(":")[0].partition("?")[0].strip().lower()
        if name == "csv" or "/" in spec:
            raise PermissionDenied(
                f"{spec}: on a shared queue the daemon reads no file a user names; use a "
                "named source (uk, electricitymaps ...) or the configured one"
            )


def when(text: str):
    from datetime import UTC

    from grid.sources.base import parse_time

    try:
        value = parse_time(text)
    except (ValueError, OverflowError):  # OverflowError: its UTC is before year 1 or past 9999
        raise SpecError(f"invalid time {text!r}: use ISO 8601, e.g. 2023-03-06T10:00") from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
