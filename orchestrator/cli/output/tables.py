"""Every table the CLI prints, in one place, without rich (it costs ~16 ms to import).

Rules: a table never cuts a number or an id. When stdout is not a terminal (a pipe, a
file) every cell is printed whole, aligned, without colours, whatever ``COLUMNS`` says.
On a terminal narrower than the table, the columns each table marks as least useful are
left out first (highest ``drop`` first), then free text (a command, a description) is
cut with an ellipsis; what is still too wide is printed whole and the terminal wraps it.
``GRIDSHIFT_TERMINAL=1`` (or ``0``) forces either mode (tests; ``watch``).

Numbers are printed by ``num``: fixed decimals, no thousands separators, ``-`` for none.
Widths are terminal cells (``cells``): East Asian wide and fullwidth characters take two,
combining marks none, so ``数据`` lines up in a pipe as on a terminal.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.signals.redact import printable

ELLIPSIS = "…"
GAP = "  "
FREE_MIN = 16  # a free-text column keeps at least this many characters before others drop
SGR = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
    "bright_black": "90",
}


@dataclass(frozen=True)
class Col:
    """A column: ``right`` aligns numbers; ``drop`` > 0 may be left out on a narrow
    terminal (the highest first); ``free`` text may be cut there with an ellipsis."""

    name: str
    right: bool = False
    drop: int = 0
    free: bool = False


def terminal() -> bool:
    forced = os.environ.get("GRIDSHIFT_TERMINAL")
    if forced in ("0", "1"):
        return forced == "1"
    return sys.stdout.isatty()


def colours() -> bool:
    return terminal() and "NO_COLOR" not in os.environ


def width() -> int:
    """The terminal's width (``COLUMNS`` first, as ``shutil`` reads it)."""
    return shutil.get_terminal_size((80, 24)).columns


def paint(text: str, style: str | None, on: bool | None = None) -> str:
    """``text`` in a colour or ``bold``/``dim`` (space-separated), on a terminal only
    (``on``: whether colours are on, where the caller knows)."""
    if not style or not (colours() if on is None else on):
        return text
    codes = ";".join(SGR[s] for s in style.split() if s in SGR)
    return f"\x1b[{codes}m{text}\x1b[0m" if codes else text


def num(value: float | None, digits: int = 1, suffix: str = "") -> str:
    """A number as every table prints it: fixed decimals, no separators; None is ``-``."""
    if value is None or value != value:
        return "-"
    text = f"{value:.{digits}f}"
    if text.startswith("-") and not text.strip("-0."):  # -0.0004 rounds to zero: "0.000"
        text = text[1:]
    return text + suffix


def say(text: str = "", style: str | None = None) -> None:
    """One line of text (a title, a note): control characters escaped, styled on a
    terminal only."""
    sys.stdout.write(paint(printable(text), style) + "\n")


Styler = Callable[[str], str | None]


def render(
    columns: Sequence[Col],
    rows: Sequence[Sequence[object]],
    *,
    styles: dict[int, Styler] | None = None,
    tty: bool | None = None,
    room: int | None = None,
) -> str:
    """The table as text, one line per row after the header (no trailing newline)."""
    tty = terminal() if tty is None else tty
    texts = [[_clean(c) for c in row] for row in rows]
    # plain ASCII (the usual table) is measured by len, the rest cell by cell
    size = len if "".join(itertools.chain.from_iterable(texts)).isascii() else cells
    widths = [
        max(len(col.name), max(map(size, [r[i] for r in texts]), default=0))
        for i, col in enumerate(columns)
    ]
    shown = list(range(len(columns)))
    left_out: list[str] = []
    if tty:
        room = width() if room is None else room
        shown, widths, left_out = _fit(columns, widths, room)
    styles = styles or {}
    on = tty and "NO_COLOR" not in os.environ
    head = [(columns[i].name, i) for i in shown]
    lines = [_line(columns, head, widths, lambda _i, _t: "bold", on, size)]
    style_of = lambda i, t: styles[i](t) if i in styles else None  # noqa: E731
    for row in texts:  # only free text is ever cut, and only on a terminal
        picked = [(_cut(row[i], widths[i]) if columns[i].free else row[i], i) for i in shown]
        lines.append(_line(columns, picked, widths, style_of, on, size))
    if left_out:
        lines.append(
            paint(
                f"(left out at this width: {', '.join(left_out)}; a pipe or --json shows all)",
                "dim",
                on,
            )
        )
    return "\n".join(lines)


def table(columns: Sequence[Col], rows: Sequence[Sequence[object]], **kwargs) -> None:
    sys.stdout.write(render(columns, rows, **kwargs) + "\n")


def _fit(columns: Sequence[Col], widths: list[int], room: int):
    shown = list(range(len(columns)))

    def need(free_min: bool) -> int:
        w = [min(widths[i], max(FREE_MIN, len(columns[i].name))) if free_min and columns[i].free
             else widths[i] for i in shown]  # fmt: skip
        return sum(w) + len(GAP) * (len(shown) - 1)

    left_out = []
    for i in sorted((i for i, c in enumerate(columns) if c.drop), key=lambda i: -columns[i].drop):
        if need(free_min=True) <= room:
            break
        shown.remove(i)
        left_out.append(columns[i].name)
    widths = list(widths)
    excess = need(free_min=False) - room
    for i in sorted((i for i in shown if columns[i].free), key=lambda i: -widths[i]):
        if excess <= 0:
            break
        floor = max(FREE_MIN, len(columns[i].name))
        cut = min(excess, max(0, widths[i] - floor))
        widths[i] -= cut
        excess -= cut
    return shown, widths, left_out


def _clean(value: object) -> str:
    """A cell with its control characters escaped (plain ASCII needs no regex: fast)."""
    text = "" if value is None else str(value)
    return text if text.isascii() and text.isprintable() else printable(text)


def cells(text: str) -> int:
    """The terminal cells ``text`` takes: East Asian wide and fullwidth characters two,
    combining marks none, others one (plain ASCII: its length, without a loop)."""
    if text.isascii():
        return len(text)
    return sum(_char_cells(c) for c in text)


def _char_cells(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _cut(text: str, size: int) -> str:
    """``text`` in at most ``size`` cells, its end an ellipsis where it is cut."""
    if text.isascii():
        return text if len(text) <= size else text[: size - 1] + ELLIPSIS
    if cells(text) <= size:
        return text
    used = 0
    for at, char in enumerate(text):
        used += _char_cells(char)
        if used > size - 1:
            return text[:at] + ELLIPSIS
    return text


def _line(columns, picked, widths, style_of, on: bool, size=len) -> str:
    out = []
    for n, (text, i) in enumerate(picked):
        last = n == len(picked) - 1
        pad = widths[i] - size(text)
        if columns[i].right:
            text_out = " " * pad + paint(text, style_of(i, text), on)
        else:
            text_out = paint(text, style_of(i, text), on) + ("" if last else " " * pad)
        out.append(text_out)
    return GAP.join(out).rstrip()
