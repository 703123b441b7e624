"""``gridshift grid``: the grid signal sources, fetching, and a look at a signal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from orchestrator.cli import context

grid_app = typer.Typer(no_args_is_help=True, help="Carbon intensity and price signals.")

SOURCE_OPT = typer.Option(
    "--source",
    "-s",
    help="uk, uk:region=13, electricitymaps:DE, watttime:CAISO_NORTH, energy-charts:DE, "
    "entsoe:DE-LU, carbon-aware:LOCATION or csv:PATH[?column=...]. Repeat for a "
    "fallback chain (default: grid.source).",
)
TIME_HELP = "ISO 8601 date or time; without an offset it is local time."
SPARK = "▁▂▃▄▅▆▇█"

DESCRIPTIONS = {
    "uk": "UK Carbon Intensity (NESO), national or regional, 30 min, no key",
    "electricitymaps": "Electricity Maps v3, hourly, lifecycle or direct, key",
    "watttime": "WattTime v3 marginal (MOER), 5 min, login",
    "energy-charts": "Energy-Charts (Fraunhofer ISE): CO2 and day-ahead price, no key",
    "entsoe": "ENTSO-E day-ahead prices (XML), security token",
    "carbon-aware": "Green Software Foundation Carbon Aware SDK web API, self-hosted",
    "csv": "CSV traces: Electricity Maps exports, price files, Time,Carbon Intensity, any CSV",
    "synthetic": "a generated signal: daily solar dip, weekly pattern, seeded noise (demos)",
}


@grid_app.command()
def sources(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the grid sources and whether each has its credentials (never their values)."""
    from grid.registry import CREDENTIALS, DEFAULT_BASE_URLS
    from orchestrator.cli.render import print_json
    from orchestrator.signals.redact import redact
    from orchestrator.signals.sources import provider_configs

    configs = provider_configs(context.get(ctx).settings)
    rows = []
    for name, description in DESCRIPTIONS.items():
        cfg = configs.get(name)
        base_url = cfg.base_url if cfg and cfg.base_url else DEFAULT_BASE_URLS.get(name)
        rows.append(
            {
                "name": name,
                "description": description,
                "base_url": redact(base_url) if base_url else None,  # a proxy's password
                "needs": list(CREDENTIALS[name]),
                "ready": cfg.has_credentials(name) if cfg else True,
            }
        )
    if as_json:
        print_json(rows)
        return
    from orchestrator.cli.output.tables import Col, table

    columns = (Col("NAME"), Col("READY"), Col("DESCRIPTION", free=True), Col("BASE URL", drop=1))
    table(
        columns,
        [[r["name"], _ready(r), r["description"], r["base_url"] or "-"] for r in rows],
        styles={1: lambda text: "green" if text == "yes" else "yellow"},
    )


def _ready(row: dict) -> str:
    return "yes" if row["ready"] else f"needs {', '.join(row['needs'])}"


def _when(text: str | None) -> datetime | None:
    """A --start or --end: ISO 8601, naive read in the local zone (as every time typed)."""
    from orchestrator.timeparse import parse_time

    return None if text is None else parse_time(text)


def _range(chain, start, end) -> tuple[datetime | None, datetime | None]:
    from orchestrator.errors import SpecError

    start, end = _when(start), _when(end)
    if start and end and start >= end:
        raise SpecError("--start must be before --end")
    if all(s.name == "csv" for s in chain.sources):
        return start, end  # a trace: the whole file unless told otherwise
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    end = end or now
    return start or end - timedelta(hours=24), end


def _load(ctx, source, start, end, forecast: bool, horizon: str):
    from orchestrator.errors import SpecError
    from orchestrator.signals.sources import open_chain
    from orchestrator.timeparse import parse_duration_s

    chain = open_chain(context.get(ctx).settings, source or [])
    if forecast:
        issued = _when(start) or datetime.now(UTC)
        return chain, chain.forecast(issued, timedelta(seconds=parse_duration_s(horizon)))
    lo, hi = _range(chain, start, end)
    if lo is None or hi is None:  # a trace without a full range: the file's own extent
        whole = chain.sources[0].history(None, None)
        lo, hi = lo or whole.start, hi or whole.end
    signal = chain.history(lo, hi) if lo < hi else None
    if signal is None or not len(signal.frame):
        raise SpecError(f"{chain.spec}: no data from {lo.isoformat()} to {hi.isoformat()}")
    return chain, signal


@grid_app.command()
def fetch(
    ctx: typer.Context,
    source: Annotated[list[str] | None, SOURCE_OPT] = None,
    start: Annotated[str | None, typer.Option(help=TIME_HELP)] = None,
    end: Annotated[str | None, typer.Option(help=TIME_HELP)] = None,
) -> None:
    """Fetch a range into the cache (default: the last 24 hours)."""
    from orchestrator.cli.render import local_time

    _chain, signal = _load(ctx, source, start, end, False, "24h")
    s = signal.summary()
    typer.echo(
        f"{s['points']} points from {signal.meta.source}, {local_time(s['start'])} to "
        f"{local_time(s['end'])}"
        f" ({s['filled']} filled)"
    )


@grid_app.command()
def show(
    ctx: typer.Context,
    source: Annotated[list[str] | None, SOURCE_OPT] = None,
    start: Annotated[str | None, typer.Option(help=TIME_HELP)] = None,
    end: Annotated[str | None, typer.Option(help=TIME_HELP)] = None,
    forecast: Annotated[
        bool,
        typer.Option("--forecast", help="The forecast from now (or --start) instead of history."),
    ] = False,
    horizon: Annotated[str, typer.Option(help="Forecast horizon.")] = "24h",
    window: Annotated[str, typer.Option(help="Length of the greenest windows.")] = "4h",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (stable keys).")] = False,
    series: Annotated[bool, typer.Option("--series", help="With --json: every point.")] = False,
) -> None:
    """Summarise a signal: range, resolution, mean/min/max, greenest windows, sparkline."""
    from orchestrator.cli.render import console, local_time, print_json
    from orchestrator.timeparse import parse_duration_s

    window_s = int(parse_duration_s(window))
    chain, signal = _load(ctx, source, start, end, forecast, horizon)
    summary = signal.summary()
    if as_json:
        if series:
            summary["series"] = [
                [t.isoformat(), None if v != v else float(v)] for t, v in signal.values.items()
            ]
        print_json(summary)
        return
    out = console()
    meta, report = signal.meta, signal.meta.report
    out.print(
        f"[bold]{meta.source}[/]  zone {meta.zone}  {meta.kind or meta.quantity}"
        f"{' ' + meta.basis if meta.basis else ''}  {meta.unit}"
    )
    out.print(
        f"{local_time(summary['start'])} → {local_time(summary['end'])}  "
        f"every {meta.resolution_s // 60} min, "
        f"{summary['points']} points"
    )
    out.print(f"mean {summary['mean']}  min {summary['min']}  max {summary['max']}")
    out.print(
        f"resampling: {report.filled} filled, {report.aggregated} averaged into "
        f"coarser intervals, {report.duplicates} duplicates, {report.missing} missing"
    )
    if meta.stale_s is not None:
        out.print(
            f"[yellow]served from the cache, {meta.stale_s / 3600:.1f} h old: "
            f"{'; '.join(chain.errors)}[/]"
        )
    out.print(sparkline(signal.values.tolist(), max(10, out.width - 2)))
    for when, mean in signal.greenest_windows(window_s):
        out.print(f"  greenest {window}: {local_time(when)}  mean {mean:.1f}")


def sparkline(values: list[float], width: int) -> str:
    clean = [v for v in values if v == v]
    if not clean:
        return ""
    size = max(1, -(-len(values) // width))
    buckets = [values[i : i + size] for i in range(0, len(values), size)]
    means = [sum(b2) / len(b2) if (b2 := [v for v in b if v == v]) else None for b in buckets]
    lo, hi = min(clean), max(clean)
    span = (hi - lo) or 1.0
    return "".join(" " if m is None else SPARK[min(7, int((m - lo) / span * 8))] for m in means)
