"""PNG plots of a what-if run (matplotlib's Agg backend through ``Figure``: no display,
no global pyplot state):

- ``carbon_power.png``: the carbon signal over the run, the cluster's power draw per
  policy beneath it, so one sees each policy move work into the troughs, and each job
  that missed its deadline as a mark at that deadline, one row per policy (the price of
  shifting);
- ``carbon_vs_jct.png``: carbon, average job completion time and deadline misses per
  policy, side by side.

Time axes are in the scenario's ``timezone`` and say which (and the year) in their label;
each title names the scenario: its deadline rule, forecast, job trace, grid and budget.
Names from the scenario (its name, policies, trace, grid) are drawn literally (no
mathtext); a figure that cannot be drawn or written is one line (exit 2).
"""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np

from orchestrator.signals.redact import drawing, drawn
from orchestrator.sim.inputs import SimInputs
from orchestrator.sim.metrics import power_timeline
from orchestrator.sim.runner import Outcome


def write_plots(outcome: Outcome, folder: Path) -> list[Path]:
    """Draw the figures and write them into ``folder`` (made if missing)."""
    paths = []
    with drawing("the plots", f"in {folder}"):
        folder.mkdir(parents=True, exist_ok=True)
        for name, fig in figures(outcome).items():
            paths.append(folder / f"{name}.png")
            fig.savefig(paths[-1], dpi=110)
    return paths


def figures(outcome: Outcome) -> dict:
    """The figures by file stem (``matplotlib.figure.Figure``; tests inspect them)."""
    with drawing("the plots"):
        return {
            "carbon_power": _carbon_power(outcome),
            "carbon_vs_jct": _carbon_vs_jct(outcome),
        }


def scenario_line(inputs: SimInputs) -> str:
    """The scenario in one line: rule, forecast, trace, grid, budget."""
    s = inputs.scenario
    trace = Path(s.jobs.source).name if not s.jobs.source.startswith("synthetic") else "synthetic"
    parts = [
        f"rule {s.jobs.deadline_rule}",
        f"forecast {s.forecast}",
        f"jobs {trace} ({len(inputs.jobs)})",
        f"grid {inputs.signal_label}",
        f"budget {s.budget or 'none'}",
    ]
    if s.jobs.interruptible:
        parts.insert(1, f"{s.jobs.interruptible:.0%} interruptible")
    return drawn(", ".join(parts))


def time_label(start_s: float, end_s: float, zone: tzinfo) -> str:
    """``time (Europe/Berlin), 2023-01-02 to 2023-01-16``: the zone and the years."""
    a, b = (datetime.fromtimestamp(t, UTC).astimezone(zone) for t in (start_s, end_s))
    return f"time ({_zone_name(zone)}), {a:%Y-%m-%d} to {b:%Y-%m-%d}"


def _carbon_power(outcome: Outcome):
    from matplotlib.figure import Figure

    inputs = outcome.inputs
    zone = _zone(inputs)
    fig = Figure(figsize=(12, 7))
    top, middle, bottom = fig.subplots(3, 1, sharex=True, height_ratios=(1, 2, 0.8))
    end = max(float(r.finish_s.max()) for r in outcome.runs.values())
    start = float(inputs.jobs.submit_s.min())
    carbon = inputs.carbon
    first, last = int(carbon.index(start)), int(carbon.index(end))
    slots = carbon.start_s + np.arange(first, last + 1) * carbon.step_s
    top.step(_dates(slots), carbon.values[first : last + 1], where="post", color="0.3", lw=0.8)
    top.set_ylabel(f"carbon\n{drawn(inputs.signal_label)}")
    top.set_title(
        f"{drawn(inputs.scenario.name)}: carbon intensity, cluster power, deadline misses"
    )
    fig.suptitle(scenario_line(inputs), fontsize=9, y=0.995)
    step = max(carbon.step_s, (end - start) / 2000)
    names = list(outcome.runs)
    colours = {name: f"C{i % 10}" for i, name in enumerate(names)}
    for name, run in outcome.runs.items():
        t, watts = power_timeline(inputs, run, step)
        middle.step(
            _dates(t), watts / 1000, where="post", lw=0.9, label=drawn(name), c=colours[name]
        )
    middle.set_ylabel("cluster power (kW)")
    middle.legend(loc="upper right")
    _draw_misses(bottom, outcome, names, colours)
    bottom.set_xlabel(time_label(start, end, zone))
    _time_axis(bottom, zone)
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def missed(outcome: Outcome, name: str) -> np.ndarray:
    """The deadlines (epoch s) that policy ``name``'s run missed, as metrics counts them."""
    inputs, run = outcome.inputs, outcome.runs[name]
    due = inputs.deadline_s
    late = ~np.isnan(due) & (run.finish_s > np.nan_to_num(due, nan=np.inf) + 1.0)
    return due[late]


def _draw_misses(ax, outcome: Outcome, names: list[str], colours: dict) -> None:
    labels = []
    for row, name in enumerate(names):
        due = missed(outcome, name)
        labels.append(f"{drawn(name)}: {len(due)}")
        ax.scatter(_dates(due), np.full(len(due), row), marker="x", s=18, c=colours[name])
    ax.set_yticks(range(len(names)), labels, fontsize=8)
    ax.set_ylim(-0.7, len(names) - 0.3)
    ax.set_ylabel("missed\ndeadlines")


def _carbon_vs_jct(outcome: Outcome):
    from matplotlib.figure import Figure

    inputs = outcome.inputs
    names = list(outcome.results)
    fig = Figure(figsize=(13, 4.5))
    axes = fig.subplots(1, 3)
    columns = (
        ("carbon_kg", "carbon (kg CO2e): jobs, idle", "tab:green"),
        ("avg_jct_h", "average job completion time (h)", "tab:blue"),
        ("deadline_misses", "deadline misses (jobs)", "tab:red"),
    )
    for ax, (key, label, colour) in zip(axes, columns, strict=True):
        values = [outcome.results[n][key] for n in names]
        bars = ax.bar(range(len(names)), values, color=colour, tick_label=[drawn(n) for n in names])
        ax.bar_label(bars, fontsize=8, label_type="center" if key == "carbon_kg" else "edge")
        if key == "carbon_kg":  # the idle servers' and GPUs' on top of the jobs'
            idle = [outcome.results[n].get("idle_carbon_kg", 0.0) for n in names]
            top = ax.bar(range(len(names)), idle, bottom=values, color="0.8", label="idle")
            ax.bar_label(top, fontsize=8)
            ax.legend(fontsize=8)
        ax.set_ylabel(label)
        ax.tick_params(axis="x", rotation=20)
    zone = _zone(inputs)
    start = float(inputs.jobs.submit_s.min())
    end = max(float(r.finish_s.max()) for r in outcome.runs.values())
    fig.suptitle(
        f"{drawn(inputs.scenario.name)}: carbon vs completion time, "
        f"{time_label(start, end, zone)}\n{scenario_line(inputs)}",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def _time_axis(ax, zone: tzinfo) -> None:
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator(tz=zone)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m-%d\n%H:%M", tz=zone))


def _zone(inputs: SimInputs) -> tzinfo:
    name = inputs.scenario.timezone
    return UTC if name.upper() == "UTC" else ZoneInfo(name)


def _zone_name(zone: tzinfo) -> str:
    return getattr(zone, "key", None) or "UTC"


def _dates(seconds: np.ndarray) -> list[datetime]:
    return [datetime.fromtimestamp(float(s), UTC) for s in seconds]
