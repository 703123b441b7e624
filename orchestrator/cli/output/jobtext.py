"""A job's cells in ``ls`` and its lines in ``show``: GPUS as a count (a range for a
queued job that accepts one), PLAN in a few words, times and numbers rounded for
reading (``--json`` keeps the exact values)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orchestrator.cli.output.tables import Col

FINAL = ("completed", "failed", "cancelled", "lost")
STATE_STYLE = {
    "queued": "cyan",
    "planned": "blue",
    "running": "green",
    "suspended": "yellow",
    "held": "yellow",
    "completed": "bright_black",
    "failed": "red",
    "cancelled": "magenta",
    "lost": "red",
}
#: ``ls``'s columns; on a narrow terminal SUBMITTED goes first, then USER, NAME, EXIT,
#: RUNTIME; COMMAND (free text) is cut with an ellipsis; ID, STATE, GPUS, PLAN never go.
LS_COLUMNS = (
    Col("ID", right=True),
    Col("NAME", drop=3),
    Col("STATE"),
    Col("USER", drop=4),
    Col("GPUS", right=True),
    Col("PLAN"),
    Col("SUBMITTED", drop=5),
    Col("RUNTIME", right=True, drop=1),
    Col("EXIT", right=True, drop=2),
    Col("COMMAND", free=True),
)


def dt(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def when(text: str | None) -> str:
    """A stored time as ``render.local_time`` prints it (to the second)."""
    from orchestrator.cli.render import local_time

    return local_time(dt(text))


def short_time(text: str | None) -> str:
    """A planned start in a cell: ``HH:MM ZONE`` (today), with the weekday within a week,
    else the date."""
    from orchestrator.timeparse import shown_time

    value = dt(text)
    if value is None:
        return "-"
    local, zone = shown_time(value)  # the time convention's zone (local, or --utc)
    today = datetime.now(local.tzinfo).date()
    days = (local.date() - today).days
    fmt = "%H:%M" if days == 0 else "%a %H:%M" if 0 < days < 7 else "%Y-%m-%d %H:%M"
    return f"{local.strftime(fmt)} {zone}"


def gpus(j: dict[str, Any]) -> str:
    """A count always: what it asks (``2-4`` for a range) until it is placed, then what
    it holds or held (GPU ids are ``show``'s)."""
    if j["state"] in ("queued", "held") or not j["node"]:
        lo, hi = j["gpus_min"], j["gpus_max"]
        return str(hi) if lo == hi else f"{lo}-{hi}"
    return str(len(j["gpu_ids"]) or j["gpus"])


def plan(j: dict[str, Any]) -> str:
    """Its planned start, or why it waits, in a few words (``-``: queued, not planned
    yet: no daemon has looked at it)."""
    reason = j.get("wait_reason")
    start = j.get("planned_start")
    if reason == "held":
        return "held"
    if reason == "dependency":
        ids = j["waits_for"]
        return f"after job{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}"
    if reason == "capacity":
        return "GPUs busy"
    if reason == "power":
        return "site power limit"
    if reason == "wake":  # "due; waiting for gpu1 to wake: ..." (Levers.wake_notes)
        note = j.get("plan_note") or ""
        name = note.removeprefix("due; waiting for ").partition(" to wake: ")[0]
        return f"{name} wake failed" if ": its wake failed (" in note else f"{name} waking"
    if reason in ("low carbon", "budget", "fallback"):
        return f"{reason} {short_time(start)}" if start else reason
    if reason == "due":
        return "due now"
    if start and j["state"] == "queued":
        return short_time(start)
    return "-" if j["state"] == "queued" else ""


def ls_row(j: dict[str, Any]) -> list[str]:
    from orchestrator.cli.render import command_text
    from orchestrator.timeparse import format_duration

    runtime = j.get("runtime_s")
    return [
        str(j["id"]),
        j["name"] or "",
        j["state"],
        j["user"],
        gpus(j),
        plan(j),
        when(j["submitted_at"]),
        "" if runtime is None else format_duration(runtime),
        "" if j["exit_code"] is None or j["state"] not in FINAL else str(j["exit_code"]),
        command_text(j["command"]),
    ]
