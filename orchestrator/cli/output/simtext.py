"""``gridshift simulate``'s result as text: the scenario, one row per policy with every
metric its ``--json`` holds (a terminal too narrow for them leaves out the least useful
first), and each budget's periods and forced starts. Numbers as ``COLUMNS`` declares."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from orchestrator.cli.output.tables import Col, num, say, table, terminal
from orchestrator.cli.render import local_time

FORCED_SHOWN = 8  # forced jobs named on a terminal (a pipe gets them all)
PERIODS_SHOWN = 14  # budget periods listed on a terminal (a pipe gets them all)


def _int(v: Any) -> str:
    return "-" if v is None else str(v)


def _f(digits: int) -> Callable[[Any], str]:
    return lambda v: num(v, digits)


def _yes(v: Any) -> str:
    return "-" if v is None else ("yes" if v else "no")


def _share(v: Any) -> str:
    return num(None if v is None else 100 * v, 1, "%")


#: (metric key, column, format). ``drop``: the higher, the sooner a narrow terminal
#: leaves it out; policy, carbon, the change against fifo and missed deadlines stay.
METRICS: tuple[tuple[str, Col, Callable[[Any], str]], ...] = (
    ("carbon_kg", Col("carbon kg", right=True), _f(1)),
    ("energy_kwh", Col("kWh", right=True, drop=6), _f(1)),
    ("idle_energy_kwh", Col("idle kWh", right=True, drop=6), _f(1)),
    ("cost", Col("cost", right=True, drop=7), _f(2)),
    ("avg_jct_h", Col("JCT h", right=True, drop=3), _f(2)),
    ("p50_jct_h", Col("p50 JCT h", right=True, drop=12), _f(2)),
    ("p95_jct_h", Col("p95 JCT h", right=True, drop=8), _f(2)),
    ("avg_wait_h", Col("wait h", right=True, drop=2), _f(2)),
    ("deadline_misses", Col("missed", right=True), _int),
    ("forced_starts", Col("forced", right=True, drop=1), _int),
    ("gpu_util", Col("GPU util", right=True, drop=5), _share),
    ("makespan_h", Col("makespan h", right=True, drop=11), _f(1)),
    ("suspensions", Col("suspends", right=True, drop=10), _int),
    ("guard_suspensions", Col("guard susp", right=True, drop=14), _int),
    ("fragmentation", Col("frag", right=True, drop=13), _f(3)),
    ("job_hours_beyond_signal", Col("h beyond signal", right=True, drop=15), _f(1)),
    ("jobs", Col("jobs", right=True, drop=9), _int),
    ("peak_power_kw", Col("peak kW", right=True, drop=16), _f(1)),  # under a site limit
    ("limit_exceeded", Col("over limit", right=True, drop=4), _yes),  # under a site limit
    ("idle_carbon_kg", Col("idle kg", right=True, drop=17), _f(1)),
    ("power_offs", Col("power-offs", right=True, drop=18), _int),  # right-sizing
    ("wakes", Col("wakes", right=True, drop=19), _int),
    ("pairs", Col("pairs", right=True, drop=9), _int),  # with co-location (``share``)
    ("colocation_moves", Col("moves", right=True, drop=18), _int),
    ("splits", Col("splits", right=True, drop=17), _int),
)
#: shown only where some policy has them (a site limit, co-location)
OPTIONAL = ("limit_exceeded", "pairs", "colocation_moves", "splits")
NOT_METRICS = ("budget", "solver", "forecast")  # said below the table, or in the scenario


def change(value: float, base: float) -> str:
    """The change against fifo, in percent with one decimal."""
    return "-" if not base else f"{100 * (value - base) / base:+.1f}%"


def columns_and_rows(data: dict) -> tuple[list[Col], list[list[str]]]:
    """The policy table; a metric the simulator adds later gets a column of its own."""
    policies = data["policies"]
    known = {key for key, _, _ in METRICS}
    extra = sorted(
        {k for m in policies.values() for k, v in m.items()
         if k not in known and k not in NOT_METRICS and not isinstance(v, dict | list)}
    )  # fmt: skip
    shown = [(key, col, fmt) for key, col, fmt in METRICS[1:]
             if key not in OPTIONAL or any(key in m for m in policies.values())]  # fmt: skip
    cols = [Col("policy"), METRICS[0][1], Col("vs fifo", right=True)]
    cols += [c for _, c, _ in shown] + [Col(k, right=True, drop=20) for k in extra]
    base = policies["fifo"]["carbon_kg"]
    rows = []
    for name, m in policies.items():
        row = [name, METRICS[0][2](m["carbon_kg"])]
        row.append(change(m["carbon_kg"], base) if name != "fifo" else "-")
        row += [fmt(m.get(key)) for key, _, fmt in shown]
        row += [_extra(m.get(k)) for k in extra]
        rows.append(row)
    return cols, rows


def _extra(v: Any) -> str:
    """A metric no column declares yet: a flag as yes/no, a number as a number."""
    if isinstance(v, bool):
        return _yes(v)
    return num(v, 3) if isinstance(v, float) else _int(v)


def scenario_lines(s: dict) -> list[str]:
    lines = [f"{s['name']}: {s['jobs']} jobs from {s['job_source']} on {s['gpus']} GPUs, "
             f"from {local_time(s['start'])}"]  # fmt: skip
    lines.append(f"grid {s['grid']}" + (f", price {s['price']}" if s["price"] else ""))
    parts = [f"deadlines {s['deadline_rule']}", f"forecast {s['forecast']}",
             f"objective {s['objective']}"]  # fmt: skip
    if s["budget"]:
        parts.append(f"budget {s['budget']}")
    if s["power_limit_w"] is not None:
        parts.append(f"power limit {num(s['power_limit_w'], 0)} W")
    lines.append(", ".join(parts))
    if s.get("share"):
        moves = {False: "no moves", True: "moves: both kinds"}.get(
            s["moves"], f"moves: {s['moves']}"
        )
        lines.append(f"share {s['share']} (two to a GPU; pair speeds: {s['pair_speeds']}, {moves})")
    lines.append(
        f"interruptible {s['interruptible']}, elastic {s['elastic']}, checkpoint "
        f"{num(s['checkpoint_s'], 0)} s, slot {num(s['slot_s'], 0)} s, skipped "
        f"{s['skip_jobs']} jobs, seed {s['seed']}, time zone {s['timezone']}"
    )
    return lines


def show(data: dict) -> None:
    s = data["scenario"]
    head, *rest = scenario_lines(s)
    say(head, "bold")
    for line in rest:
        say(line)
    cols, rows = columns_and_rows(data)
    table(cols, rows)
    say("JCT: job completion time (submission to finish), mean; wait: to first start;", "dim")
    say("forced: starts a deadline made against the budget or the objective", "dim")
    for name, m in data["policies"].items():
        if m.get("solver"):
            said = ", ".join(f"{k} {v}" for k, v in m["solver"].items())
            say(f"solver under {name}: {said}")
    if s["budget"]:
        _budgets(s, data["policies"])
    if s["price_unit"]:
        say(f"cost in {s['price_unit']}")
    for note in s["notes"]:
        say(f"note: {note}", "dim")
    for path in data.get("plots", []):
        say(f"wrote {path}")


def _budgets(s: dict, policies: dict) -> None:
    every = not terminal()
    kept = {name: m["budget"] for name, m in policies.items() if m.get("budget")}
    for name, b in kept.items():
        unit = b.get("unit", "kg")
        say(
            f"budget {b['budget']} ({b['kind']}, {num(b['per_period_kg'], 3)} {unit} per "
            f"{b['period']}) under {name}: {b['periods_over']} of {b['periods']} periods over, "
            f"by {num(b['over_kg'], 3)} {unit} in all; spent {num(b['spent_kg'], 3)} {unit}, "
            f"at most {num(b['max_period_kg'], 3)} {unit} in a period"
        )
        forced = b.get("forced_jobs") or []
        if forced:
            named = forced if every else forced[:FORCED_SHOWN]
            listed = ", ".join(
                f"job {f['job']} at {_utc(f['start_s'])} ({num(f['kg'], 3)} {unit})" for f in named
            )
            more = f" and {len(forced) - len(named)} more" if len(forced) > len(named) else ""
            say(f"  {b['forced_starts']} forced by deadlines: {listed}{more}; "
                f"{num(b['forced_kg'], 3)} {unit} in all")  # fmt: skip
    periods = max((len(b.get("by_period") or []) for b in kept.values()), default=0)
    if periods and (every or periods <= PERIODS_SHOWN):
        cols = [Col("period (UTC)")]
        for name in kept:
            cols += [Col(f"{name} kg", right=True), Col(f"{name} forced", right=True, drop=1)]
        rows = []
        for i in range(periods):
            got = [b["by_period"][i] if i < len(b["by_period"]) else None for b in kept.values()]
            row = [_utc(next(p for p in got if p)["start_s"])]
            for p in got:
                row += [num(p["kg"], 3), num(p["forced_kg"], 3)] if p else ["-", "-"]
            rows.append(row)
        table(cols, rows)


def _utc(seconds: float) -> str:
    """A simulated time, as every time is printed (``render.local_time``: with its zone)."""
    return local_time(datetime.fromtimestamp(seconds, UTC))
