"""``gridshift show`` as text: only the fields that have a value, in groups (the job,
its state and times, its plan, energy and carbon, runs, history), times to the second,
energy and carbon with units and three significant digits. ``--json`` keeps every key
and the exact values."""

from __future__ import annotations

import math
import shlex
from typing import Any

from orchestrator.cli.output.jobtext import FINAL, gpus, plan, when
from orchestrator.cli.output.tables import paint, say

Pairs = list[tuple[str, str]]


def sig(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, never in scientific notation."""
    if value == 0 or not math.isfinite(value):
        return f"{value:.0f}" if math.isfinite(value) else str(value)
    places = max(0, min(9, digits - 1 - math.floor(math.log10(abs(value)))))
    return f"{value:.{places}f}"


def energy(kwh: float | None, modelled: bool | None = None) -> str | None:
    if kwh is None:
        return None
    text = f"{sig(kwh)} kWh" if kwh >= 1 else f"{sig(kwh * 1e3)} Wh"
    return text + (" (modelled)" if modelled else "")


def carbon(grams: float | None) -> str | None:
    if grams is None:
        return None
    return f"{sig(grams / 1e3)} kg CO2e" if grams >= 1e3 else f"{sig(grams)} g CO2e"


def _job(d: dict[str, Any]) -> Pairs:
    from orchestrator.timeparse import format_duration

    placed = d["gpu_ids"] and d["state"] not in ("queued", "held")
    held = f"{gpus(d)} ({d['node']}: GPU {', '.join(map(str, d['gpu_ids']))})" if placed else None
    asks = f"{gpus(d)} (asks for)" if not placed else held
    return [
        ("command", shlex.join(d["command"])),
        ("workdir", d["workdir"]),
        ("user", d["user"]),
        ("gpus", asks),
        ("gpu type", d.get("gpu_type")),  # checked at submit: letters, digits, . _ -
        ("priority", str(d["priority"]) if d["priority"] else None),
        ("labels", ", ".join(d["labels"]) or None),
        ("after", ", ".join(f"job {a}" for a in d["after"]) or None),
        ("interruptible", "yes" if d["interruptible"] else None),
        ("share", "yes (may run two to a GPU)" if d.get("share") else None),
        ("duration", format_duration(d["duration_s"]) if d["duration_s"] else None),
        ("checkpoint", None if d["checkpoint_s"] is None else format_duration(d["checkpoint_s"])),
        ("deadline", when(d["deadline"]) if d["deadline"] else None),
        ("cron", f"template {d['cron_id']}" if d["cron_id"] is not None else None),
        ("log", d["log_path"]),
    ]


def _times(d: dict[str, Any]) -> Pairs:
    from orchestrator.timeparse import format_duration

    progress, runtime = d["progress"], d.get("runtime_s")
    final = d["state"] in FINAL  # a requeued job keeps its last attempt's code: not shown
    return [
        ("state", d["state"] + (f" ({d['reason']})" if d["reason"] else "")),
        ("submitted", when(d["submitted_at"])),
        ("started", when(d["started_at"]) if d["started_at"] else None),
        ("finished", when(d["finished_at"]) if d["finished_at"] else None),
        ("runtime", None if runtime is None else f"{format_duration(runtime)} (not suspended)"),
        ("exit code", str(d["exit_code"]) if d["exit_code"] is not None and final else None),
        ("attempts", str(d["attempts"]) if d["attempts"] else None),
        (
            "progress",
            None if progress is None else f"{100 * progress:.0f}% ({d['progress_source']})",
        ),
        ("cancel", "requested" if d["cancel_requested"] else None),
    ]


def _plan(d: dict[str, Any]) -> Pairs:
    reason = d.get("wait_reason")
    waits = plan(d) if reason and reason != "planned" else None
    return [
        ("waits", waits),
        ("planned start", when(d["planned_start"]) if d["planned_start"] else None),
        ("why", d["plan_note"]),
        ("estimate", d.get("estimate")),
    ]


def _energy(d: dict[str, Any]) -> Pairs:
    forced = None
    if d.get("forced_g") is not None:
        forced = f"{carbon(d['forced_g'])}, {energy(d['forced_kwh'])} expected at start"
    return [
        ("energy", energy(d["energy_kwh"], d["energy_modelled"])),
        ("carbon", carbon(d["carbon_g"])),
        ("cost", sig(d["cost"]) if d["cost"] is not None else None),
        ("forced by deadline", forced),
    ]


def show(d: dict[str, Any]) -> None:
    title = f"job {d['id']}" + (f"  {d['name']}" if d["name"] else "")
    say(title, "bold")
    for group, pairs in (("", _job(d)), ("state", _times(d)), ("plan", _plan(d)),
                         ("energy and carbon", _energy(d))):  # fmt: skip
        kept = [(k, v) for k, v in pairs if v not in (None, "")]
        if not kept:
            continue
        if group:
            say(group, "bold")
        size = max(len(k) for k, _ in kept)
        for key, value in kept:
            say(f"  {key.ljust(size)}  {value}")
    if d["runs"]:
        say("runs", "bold")
        for r in d["runs"]:
            say("  " + _run(r))
            if (s := r["slurm"]) is not None:
                said = s.get("error") or f"{s['state']}, exit code {s['exit_code']}"
                say(f"     Slurm job {s['job_id']}: {said}")
    say("history", "bold")
    for e in d["events"]:
        reason = f"  ({e['reason']})" if e["reason"] else ""
        moved = f"{e['from']} → {e['to']}" if e["from"] else e["to"]
        say(f"  {when(e['at'])}  {moved}{reason}")


def _run(r: dict[str, Any]) -> str:
    if r.get("parts"):  # a job across servers
        on = " + ".join(f"{p['node']} GPU {', '.join(map(str, p['gpu_ids']))}" for p in r["parts"])
        parts = [f"#{r['attempt']} {r['state']} on {on}"]
    else:
        parts = [f"#{r['attempt']} {r['state']} on {r['node']}"]
        parts.append(f"GPU {', '.join(map(str, r['gpu_ids']))}" if r["gpu_ids"] else "no GPU")
    if r["started_at"]:
        span = when(r["started_at"])
        parts.append(span + (f" → {when(r['finished_at'])}" if r["finished_at"] else ""))
    if r["exit_code"] is not None:
        parts.append(f"exit {r['exit_code']}")
    if r["cap"]:
        parts.append(f"cap {100 * r['cap']:.0f}%")
    for text in (energy(r["energy_kwh"], r["energy_modelled"]), carbon(r["carbon_g"])):
        if text:
            parts.append(text)
    if r.get("forced_g") is not None:
        parts.append(paint("forced by its deadline beyond the budget", "yellow"))
    if r.get("backfilled_until"):
        parts.append(f"backfilled ahead of a waiting job: to end by {when(r['backfilled_until'])}")
    return ", ".join(parts)
