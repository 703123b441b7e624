"""The one error hierarchy of gridshift. The CLI prints one line for any of these and
exits with ``exit_code``: 2 for a user's mistake, 1 for a failure.

    GridshiftError
    ├── UserError (exit 2)
    │   ├── SpecError           a job spec or command line that cannot be accepted
    │   ├── ConfigError         a configuration file or setting that cannot be used
    │   ├── NotFoundError       an unknown job id or node
    │   ├── PermissionDenied    acting on another user's job
    │   ├── SchemaError         a database older (or newer) than this gridshift
    │   └── PlacementError      a request no node could ever satisfy
    ├── StateError              an illegal job state transition
    ├── StoreError              the database failed
    ├── ExecutorError           running or signalling a job failed
    ├── GridDataError           a grid signal could not be had
    └── DaemonError             the daemon cannot run (e.g. another one holds the lock)

The leaf packages raise their own exceptions (they import nothing of the orchestrator);
``translate`` maps those, and foreign errors such as SQLAlchemy's, at one boundary
(``boundary()``, at the CLI's and the daemon's edges; the database has its own in
``queue.db``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


class GridshiftError(Exception):
    exit_code = 1


class UserError(GridshiftError):
    exit_code = 2


class SpecError(UserError):
    pass


class ConfigError(UserError):
    pass


class NotFoundError(UserError):
    pass


class PermissionDenied(UserError):
    pass


class PlacementError(UserError):
    pass


class SchemaError(UserError):
    pass


class StateError(GridshiftError):
    pass


class StoreError(GridshiftError):
    pass


class ExecutorError(GridshiftError):
    pass


class GridDataError(GridshiftError):
    pass


class DaemonError(GridshiftError):
    pass


def translate(exc: BaseException) -> GridshiftError | None:
    """The gridshift error for a foreign or leaf exception, or None if it is not ours."""
    if isinstance(exc, GridshiftError):
        return exc
    import executors.errors as ex
    import placement.errors as pl

    grid_errors = sys.modules.get("grid.errors")  # only loaded by the grid commands
    if grid_errors is not None and isinstance(exc, grid_errors.GridDataError):
        if isinstance(exc, grid_errors.SourceSpecError):
            return SpecError(str(exc))
        return GridDataError(str(exc))

    if isinstance(exc, ex.ExecutorError):
        return ExecutorError(str(exc))
    if isinstance(exc, pl.PlacementError):
        return PlacementError(str(exc))
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return GridshiftError(f"{exc.strerror or exc}{where}")
    module = type(exc).__module__
    if module.startswith("sqlalchemy"):
        orig = getattr(exc, "orig", None)
        return StoreError(f"database error: {orig or exc}")
    return None


#: what pydantic puts before a validator's own message: the message says it all
_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def first_invalid(exc: Exception) -> tuple[tuple, str]:
    """A pydantic validation error's first problem: where (its ``loc``) and what, in the
    validator's own words (pydantic's "Value error, " dropped)."""
    errors = getattr(exc, "errors", None)
    if not callable(errors) or not errors():
        return (), str(exc)
    first = errors()[0]
    msg = str(first["msg"])
    for prefix in _PYDANTIC_PREFIXES:
        msg = msg.removeprefix(prefix)
    return tuple(first["loc"]), msg


@contextmanager
def boundary() -> Iterator[None]:
    """The one place foreign errors become gridshift errors: the CLI's and the daemon's
    edges (and the what-if inputs, used by both) run inside it, as httpx maps transport
    errors in one place. A gridshift error passes through; a foreign one that
    ``translate`` knows is raised as its gridshift error; anything else (a bug) passes
    through unchanged, traceback and all."""
    try:
        yield
    except GridshiftError:
        raise
    except Exception as exc:
        translated = translate(exc)
        if translated is None:
            raise
        raise translated from exc
