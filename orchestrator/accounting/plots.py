"""Figures of what ran (matplotlib ``Figure`` objects on the Agg backend: no display, no
pyplot state), from the answers of the ``report`` and ``job_power`` requests:

- ``report_figure``: kg CO2e per user and per label as run and at submission, titled with
  the period the jobs cover and the saving against running each at submission;
- ``job_figure``: one job's power over its attempts (measured samples, else the modelled
  mean), the area under it coloured by the grid's carbon intensity (g/kWh), the signal
  above it, and the gaps between attempts (suspensions, requeues) hatched.

Times are drawn in ``zone`` (the caller's local zone by default) and the axis says which.
Text from users (names, users, labels, sources) is drawn literally (``drawn``: no
mathtext, control characters written out); building, laying out and saving a figure
happen inside ``drawing``, where any failure is one line (exit 2).
"""

from __future__ import annotations

import functools
import itertools
from datetime import UTC, datetime, tzinfo
from pathlib import Path

from orchestrator.accounting.labels import label_rows
from orchestrator.errors import SpecError
from orchestrator.signals.redact import drawing, drawn


def _drawn_inside(build):
    @functools.wraps(build)
    def guarded(*args, **kwargs):
        with drawing():
            return build(*args, **kwargs)

    return guarded


def save(fig, path: Path) -> None:
    """Write ``fig`` (PNG, SVG or PDF by the suffix); a path that cannot be written is the
    user's mistake (one line, exit 2)."""
    kind = path.suffix[1:].lower()
    known = fig.canvas.get_supported_filetypes()
    if kind and kind not in known:
        raise SpecError(
            f"cannot write the plot {path}: format {kind!r} unknown; known: {', '.join(known)}"
        )
    with drawing("the plot", path):
        fig.savefig(path, dpi=110)


def local_zone() -> tzinfo:
    """The zone times are drawn in: the convention's (local, UTC with ``--utc``)."""
    from orchestrator.timeparse import local_zone as machine_zone
    from orchestrator.timeparse import utc_shown

    return UTC if utc_shown() else machine_zone()


def zone_name(zone: tzinfo) -> str:
    return getattr(zone, "key", None) or datetime.now(zone).tzname() or "UTC"


@_drawn_inside
def report_figure(data: dict, zone: tzinfo | None = None):
    from matplotlib.figure import Figure

    zone = zone or local_zone()
    fig = Figure(figsize=(11, 4.5))
    axes = fig.subplots(1, 2)
    labels = label_rows(data)  # other users' jobs in one bar: their labels are private
    groups = [("user", list(data["by_user"].items())), ("label", labels)]
    for ax, (title, rows) in zip(axes, groups, strict=True):
        names = [n for n, _ in rows]
        shown = [drawn(n if len(n) <= 40 else n[:39] + "…") for n in names]
        actual = [r["carbon_kg"] or 0.0 for _, r in rows]
        base = [r["carbon_at_submission_kg"] or 0.0 for _, r in rows]
        x = range(len(names))
        ax.bar([i - 0.2 for i in x], base, width=0.4, label="at submission", color="#bbbbbb")
        ax.bar([i + 0.2 for i in x], actual, width=0.4, label="as run", color="#2a9d8f")
        ax.set_xticks(list(x), shown, rotation=30, ha="right")
        ax.set_title(f"kg CO2e by {title}")
        ax.legend()
    fig.suptitle(f"{report_period(data, zone)}\n{report_saving(data)}", fontsize=10)
    fig.tight_layout()
    return fig


def report_period(data: dict, zone: tzinfo) -> str:
    """``jobs submitted 2026-11-16 09:00 to 2026-11-23 17:40 CET (12 jobs)``."""
    start = data.get("since") or data.get("first_submitted_at")
    end = data.get("last_finished_at")
    jobs = data["total"]["jobs"]
    if not start:
        return "no jobs ran in the period"
    text = f"jobs submitted from {_fmt(start, zone)}"
    if end:
        text += f", run until {_fmt(end, zone)}"
    return f"{text} ({zone_name(zone)}; {jobs} job{'s' if jobs != 1 else ''})"


def report_saving(data: dict) -> str:
    total = data["total"]
    signal = data.get("signal")
    if total["saving_pct"] is None:
        why = "no grid signal covers the runs" if not signal else "nothing to compare"
        return f"saving against running at submission: unknown ({why})"
    saved = (total["carbon_at_submission_kg"] or 0.0) - (total["carbon_kg"] or 0.0)
    return (
        f"saving against running at submission: {total['saving_pct'] + 0.0:.1f}% "
        f"({saved:.3f} kg CO2e; signal {drawn(signal)})"
    )


@_drawn_inside
def job_figure(data: dict, zone: tzinfo | None = None):
    import matplotlib.dates as mdates
    from matplotlib import colormaps
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    zone = zone or local_zone()
    fig = Figure(figsize=(11, 5.5))
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(1, 2))
    carbon = data["carbon"]
    runs = data["runs"]
    start_s = min(r["start_s"] for r in runs)
    end_s = max(r["end_s"] for r in runs)
    cmap = colormaps["RdYlGn_r"]
    norm = None
    if carbon:
        values = carbon["values"]
        times = [carbon["start_s"] + i * carbon["step_s"] for i in range(len(values) + 1)]
        top.step(_dates(times), [*values, values[-1]], where="post", color="0.3", lw=0.9)
        top.set_ylabel(f"carbon\n{drawn(carbon['zone'])} ({drawn(carbon['unit'])})")
        norm = Normalize(min(values), max(values) if max(values) > min(values) else min(values) + 1)
    else:
        top.text(0.5, 0.5, "no grid signal covers the run", ha="center", transform=top.transAxes)
        top.set_ylabel("carbon")
    for r in runs:
        top.axvspan(*_dates([r["start_s"], r["end_s"]]), color="tab:blue", alpha=0.12)
        _draw_power(bottom, r, carbon, cmap, norm)
    for before, after in itertools.pairwise(runs):
        if after["start_s"] > before["end_s"]:
            span = _dates([before["end_s"], after["start_s"]])
            bottom.axvspan(*span, facecolor="none", hatch="//", edgecolor="0.6", lw=0)
            bottom.text(span[0], 0, " suspended", fontsize=8, va="bottom", color="0.4")
    for e in data["events"]:
        if e["to"] in ("suspended", "stopped"):
            bottom.axvline(datetime.fromisoformat(e["at"]), color="0.4", ls=":", lw=1)
    if norm is not None:
        from matplotlib.cm import ScalarMappable

        bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=[top, bottom], pad=0.01)
        bar.set_label(f"carbon intensity ({drawn(carbon['unit'])})")
    measured = all(r["samples"] for r in runs)
    bottom.set_ylabel("power (W)" + ("" if measured else ", modelled where no samples"))
    bottom.set_ylim(bottom=0)
    margin = max(5.0, 0.05 * (end_s - start_s))
    bottom.set_xlim(*_dates([start_s - margin, end_s + margin]))
    a, b = (datetime.fromtimestamp(t, UTC).astimezone(zone) for t in (start_s, end_s))
    bottom.set_xlabel(f"time ({zone_name(zone)}), {a:%Y-%m-%d %H:%M} to {b:%Y-%m-%d %H:%M}")
    bottom.xaxis.set_major_locator(mdates.AutoDateLocator(tz=zone))
    ticks = "%Y-%m-%d\n%H:%M" + (":%S" if end_s - start_s < 600 else "")
    bottom.xaxis.set_major_formatter(mdates.DateFormatter(ticks, tz=zone))
    name = f" ({drawn(data['name'])})" if data.get("name") else ""
    source = f", signal {drawn(carbon['source'])}" if carbon else ""
    top.set_title(
        f"job {data['job']}{name}, {data['state']}: power and carbon over "
        f"{len(runs)} attempt{'s' if len(runs) != 1 else ''}{source}"
    )
    return fig


def _draw_power(ax, run: dict, carbon: dict | None, cmap, norm) -> None:
    """The attempt's power as a step line, the area beneath coloured by carbon."""
    import matplotlib.dates as mdates

    if run["samples"]:
        starts = [t for t, _ in run["samples"]]
        watts = [w for _, w in run["samples"]]
        ends = [*starts[1:], run["end_s"]]
    elif run["modelled_w"] is not None:
        starts, watts, ends = [run["start_s"]], [run["modelled_w"]], [run["end_s"]]
    else:
        return
    pieces = _cut(starts, ends, watts, carbon)
    lefts = mdates.date2num(_dates([p[0] for p in pieces]))
    widths = [(p[1] - p[0]) / 86400 for p in pieces]
    colours = [
        cmap(norm(p[3])) if norm is not None and p[3] is not None else "tab:blue" for p in pieces
    ]
    ax.bar(lefts, [p[2] for p in pieces], width=widths, align="edge", color=colours, lw=0)
    ax.step(_dates([*starts, ends[-1]]), [*watts, watts[-1]], where="post", color="k", lw=0.8)


def _cut(starts, ends, watts, carbon) -> list[tuple[float, float, float, float | None]]:
    """(start, end, W, g/kWh) pieces: the power's steps cut at the signal's slots."""
    out = []
    for t0, t1, w in zip(starts, ends, watts, strict=True):
        t = t0
        while t < t1:
            if carbon:
                i = int((t - carbon["start_s"]) // carbon["step_s"])
                i = min(max(i, 0), len(carbon["values"]) - 1)
                slot_end = carbon["start_s"] + (i + 1) * carbon["step_s"]
                nxt = min(t1, slot_end) if slot_end > t else t1
                out.append((t, nxt, w, carbon["values"][i]))
            else:
                nxt = t1
                out.append((t, nxt, w, None))
            t = nxt
    return out


def _fmt(text: str, zone: tzinfo) -> str:
    return f"{datetime.fromisoformat(text).astimezone(zone):%Y-%m-%d %H:%M}"


def _dates(seconds) -> list[datetime]:
    return [datetime.fromtimestamp(float(s), UTC) for s in seconds]
