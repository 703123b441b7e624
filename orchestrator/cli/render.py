"""JSON output (stable keys) and text helpers; every table is ``cli.output.tables``'s.

Human output shows what users typed (names, labels, commands, reasons) with control
characters escaped (``\\x1b``): ``console()`` escapes every string it renders, ``safe``
also escapes rich markup for values put inside markup, ``plain`` is for ``typer.echo``
lines. ``--json`` keeps the exact values (JSON escapes them)."""

from __future__ import annotations

import json
import math
import shlex
import sys
from datetime import datetime
from typing import Any

from orchestrator.daemon.ops.views import JOB_KEYS, iso, job_dict, progress_of  # noqa: F401
from orchestrator.signals.redact import printable


def local_time(value: datetime | str | None, *, seconds: bool = False) -> str:
    """Every time the CLI prints, with its zone: local (``2026-11-24 07:40 CET``), or UTC
    with ``--utc`` or ``GRIDSHIFT_UTC=1``. ``value``: a datetime (naive: UTC) or ISO
    text as the ops return it; None: ``-``."""
    from orchestrator.timeparse import format_time

    return format_time(value, seconds=seconds)


def print_json(data: Any) -> None:
    """JSON as the standard has it: a value that is not a finite number (which Python
    would write as NaN or Infinity, which no JSON reader takes) is written null."""
    try:
        text = json.dumps(data, indent=2, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(data), indent=2, allow_nan=False)
    sys.stdout.write(text + "\n")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def plain(value: Any) -> str:
    """A value for a plain text line: control characters escaped."""
    return printable(str(value))


def safe(value: Any) -> str:
    """A value to put inside rich markup: control characters and markup escaped (a name
    such as ``[link=...]`` is shown, not obeyed)."""
    from rich.markup import escape

    return escape(printable(str(value)))


def command_text(command: list[str], width: int | None = None) -> str:
    """A command as a shell would read it, escaped; cut to ``width`` only where asked
    (a table cuts its free text itself, on a terminal only)."""
    text = printable(shlex.join(command))
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def console():
    """A rich console that escapes control characters in every string it renders (table
    cells included); Text objects built by hand must escape their own (``plain``)."""
    from rich.console import Console

    class _Console(Console):
        def render_str(self, text: str, **kwargs):
            return super().render_str(printable(text), **kwargs)

    # piped or redirected: one line per message, never wrapped at 80 columns
    return _Console(highlight=False, soft_wrap=not sys.stdout.isatty())
