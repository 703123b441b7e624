"""``status``'s node lines: a server right-sizing powered off, is waking or whose wake
failed says so (since when; the failure, escaped and cut, and when it is tried again),
not "unreachable", which a user reads as broken. A server unreachable while right-sizing
has it on (or that right-sizing does not manage) is still unreachable."""

from __future__ import annotations

from datetime import datetime

from orchestrator.daemon.energy.powercmd import SHOWN_CHARS, escape

LABEL = "[bold]node[/]       "


def node_lines(unreachable: dict | None, power: dict | None, now: datetime) -> list[str]:
    """Rich markup lines, one per node worth a word: unreachable (``nodes_unreachable``:
    name -> since) or not on (``nodes_power``: name -> power_state, since, error,
    retry_at), by name."""
    from orchestrator.cli.render import local_time, safe

    unreachable, power = unreachable or {}, power or {}
    shown = {n for n, p in power.items() if isinstance(p, dict) and _state(p) != "on"}
    lines = []
    for name in sorted(set(unreachable) | shown, key=str):
        p = power.get(name) if name in shown else None
        if p is None:
            lines.append(f"{LABEL}[red]{safe(name)} unreachable[/] since "
                         f"{local_time(unreachable[name])}")  # fmt: skip
            continue
        lines.append(LABEL + safe(name) + " " + _power_words(p, now))
    return lines


def _state(p: dict) -> str:
    return str(p.get("power_state") or "on")


def _power_words(p: dict, now: datetime) -> str:
    from orchestrator.cli.render import local_time, safe

    state, since = _state(p), p.get("since")
    at = f" since {local_time(since)}" if since else ""
    if state == "off":
        return f"off{at} (powered down by right-sizing while idle; woken for a job)"
    if state == "powering off":
        return f"powering off{at} (right-sizing: idle)"
    if state == "waking":
        return f"waking{at} (right-sizing woke it for a job)"
    if state != "wake failed":
        return safe(state) + at
    error = safe(escape(str(p.get("error") or "no reason given"))[:SHOWN_CHARS])
    retry = _when(p.get("retry_at"))
    again = f"at {local_time(retry)}" if retry and retry > now else "when a job next needs it"
    return f"[red]wake failed[/]{at}: {error}; tried again {again}"


def _when(text) -> datetime | None:
    """An ISO time with its offset (the daemon writes UTC); anything else: None."""
    try:
        value = datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return value if value is not None and value.tzinfo is not None else None
