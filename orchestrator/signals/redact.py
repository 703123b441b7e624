"""What logs and terminals are shown: secrets redacted, control characters escaped.

The one place for both (the CLI and the daemon import it). ``redact`` hides the values of
token and key query parameters (``securityToken=``, ``api_key=`` ...), ``Authorization``
and ``auth-token`` header values, the password in ``scheme://user:password@host`` and any
secret value this process was told about (``remember``: the providers' keys, the
database password). ``printable`` escapes C0 and C1 control characters, DEL, the
Unicode bidirectional overrides and the zero-width characters, so text from users (job
names, labels, commands, reasons) cannot move another user's cursor, retitle their
terminal, clear it or pass for other text.
``LogHygiene`` applies both to every record a gridshift log handler emits;
``LineFormatter`` writes the daemon's log when it goes to a file or a pipe.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

HIDDEN = "***"
# query parameters and ``name=value`` pairs whose value is a secret: the unmistakable
# names anywhere, the common words (key, token ...) only as a URL's query parameters
_SPECIFIC = (
    r"securitytoken|access[_-]?token|auth[_-]?token|api[_-]?key|apikey|password|passwd|"
    r"client[_-]?secret"
)
_COMMON = r"token|key|secret|signature|sig"
_NAMES = f"{_SPECIFIC}|{_COMMON}"
_ASSIGNED = re.compile(
    rf"((?<![\w-])(?:{_SPECIFIC})|(?<=[?&;])(?:{_COMMON}))=([^\s&#'\"<>]+)", re.IGNORECASE
)
# header lines and header dicts: "Authorization: Bearer x", {'auth-token': 'x'}
_HEADER = re.compile(
    r"(?<![\w-])((?:proxy-)?authorization|auth-token|x-api-key|api-key)"
    r"(['\"]?\s*:\s*['\"]?)((?:bearer|basic|token)\s+)?([^\s'\",}]+)",
    re.IGNORECASE,
)
# JSON-ish quoted pairs: "token": "x"
_QUOTED = re.compile(rf"([\"'])((?:{_NAMES}))\1(\s*:\s*)([\"'])([^\"']*)\4", re.IGNORECASE)
# the password of a URL's user information: scheme://user:password@host
_USERINFO = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]*):([^/\s]+)@", re.IGNORECASE)

_known: set[str] = set()


def remember(*secrets: str | None) -> None:
    """Secret values to hide wherever they appear (short ones are too common to hide)."""
    _known.update(s for s in secrets if s and len(s) >= 4)


def remember_url(url: str | None) -> None:
    """Remember the password of a URL with one (a database URL)."""
    match = _USERINFO.search(url or "")
    if match:
        remember(match[2])


def redact(text: str) -> str:
    """``text`` with every secret value it shows replaced by ``***``."""
    for secret in sorted(_known, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, HIDDEN)
    text = _USERINFO.sub(rf"\1:{HIDDEN}@", text)
    text = _HEADER.sub(lambda m: f"{m[1]}{m[2]}{m[3] or ''}{HIDDEN}", text)
    text = _QUOTED.sub(lambda m: f"{m[1]}{m[2]}{m[1]}{m[3]}{m[4]}{HIDDEN}{m[4]}", text)
    return _ASSIGNED.sub(rf"\1={HIDDEN}", text)


# C0 controls, DEL, C1 controls (0x9b is a one-byte CSI), every bidirectional control
# (marks, the Arabic letter mark, overrides, isolates), line and paragraph separators, and
# the invisible characters (zero-width space and joiners, word joiner, invisible operators,
# soft hyphen, Mongolian vowel separator, byte-order mark: ``\u200bls`` must not look
# like ``ls``)
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\xad\u061c\u180e\u200b-\u200f\u2028\u2029\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\ufeff]"
)
_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match) -> str:
    char = match.group()
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with control characters written out (ESC as ``\\x1b``), so it prints as
    what it is. ``keep_newlines``: line breaks stay (a traceback)."""
    if keep_newlines:
        return "\n".join(_CONTROL.sub(_escape, line) for line in text.split("\n"))
    return _CONTROL.sub(_escape, text)


def drawn(value: object) -> str:
    """User text as a figure draws it literally: control characters written out, and
    ``$`` escaped so matplotlib never reads ``$...$`` as mathtext (``cost $5 and $6``)."""
    return printable(str(value)).replace("$", "\\$")


@contextmanager
def drawing(what: str = "the plot", where: object = None) -> Iterator[None]:
    """Where figures are built, laid out and saved: matplotlib's missing-glyph warnings
    are silenced (they would print a user's text raw) and any failure is one line:
    ``cannot write {what} {where}: ...`` for the file, ``cannot draw {what}: ...`` else."""
    from orchestrator.errors import SpecError

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing", category=UserWarning)
        warnings.filterwarnings("ignore", message="Tight layout not applied", category=UserWarning)
        try:
            yield
        except SpecError:
            raise
        except OSError as exc:
            target = f"{what} {where}" if where is not None else what
            raise SpecError(f"cannot write {target}: {printable(str(exc))}") from None
        except Exception as exc:  # matplotlib's own limits: one line, not a traceback
            first = (str(exc).splitlines() or [""])[0][:200]
            raise SpecError(
                f"cannot draw {what}: {type(exc).__name__}: {printable(first)}"
            ) from None


class LogHygiene(logging.Filter):
    """On a handler: each record's final message, traceback and stack redacted and
    escaped (one line per record: a name holding a newline cannot forge another)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: let logging report it as it does
            return True
        record.msg, record.args = printable(redact(message)), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = printable(redact(record.exc_text), keep_newlines=True)
        if record.stack_info:
            record.stack_info = printable(redact(record.stack_info), keep_newlines=True)
        return True


QUIET = ("httpx", "httpcore")


def guard(handler: logging.Handler) -> logging.Handler:
    """Make ``handler`` safe to show: ``LogHygiene`` on it, the HTTP libraries (whose
    INFO lines carry full URLs, query tokens and all) at WARNING, and APScheduler at ERROR
    (a pass skipped while the one before runs is the daemon's business, not its users')."""
    handler.addFilter(LogHygiene())
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    return handler


class LineFormatter(logging.Formatter):
    """Log lines to read later (stderr not a terminal): one per record, the time in ISO
    8601 UTC with its offset, the level, the logger, the message; no padding, no
    wrapping. A traceback, where a record has one, stays on the record's line, its line
    breaks written ``\\n`` (a newline in an exception's message cannot forge a record)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\n", "\\n")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


class TerminalFormatter(logging.Formatter):
    """The message on a terminal (rich draws the time and level): a traceback may span
    lines, each indented, so none starts what looks like a record of its own."""

    def __init__(self) -> None:
        super().__init__("%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\n", "\n    ")


class JsonFormatter(LineFormatter):
    """``--log-format json``: one JSON object per line, with stable keys ``time`` (ISO
    8601 UTC with offset), ``level``, ``logger``, ``message``, and ``exception`` (the
    traceback's text) where a record has one. The message is redacted and escaped by
    ``LogHygiene`` first, as in the text lines."""

    def format(self, record: logging.LogRecord) -> str:  # one line: JSON escapes them
        import json

        entry = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = printable(
                redact(self.formatException(record.exc_info)), keep_newlines=True
            )
        if record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = record.stack_info
        return json.dumps(entry, ensure_ascii=False)
