"""``gridshift simulate``: replay a job trace against a grid trace under each policy and
compare them with ``fifo``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli import context

Opt = typer.Option


def simulate(
    ctx: typer.Context,
    scenario: Annotated[
        Path | None, typer.Argument(help="Scenario TOML (see examples/whatif.toml).")
    ] = None,
    policy: Annotated[
        str | None, Opt("--policy", help="Policies, e.g. fifo,lowest-window.")
    ] = None,
    forecast: Annotated[str | None, Opt("--forecast", help="perfect, naive or noise:0.1.")] = None,
    as_json: Annotated[bool, Opt("--json", help="Print JSON (stable keys).")] = False,
    plot: Annotated[Path | None, Opt("--plot", help="Write PNG plots into this folder.")] = None,
    jobs: Annotated[
        str | None, Opt("--jobs", help="Job trace (Philly, Tiresias, specs) or synthetic:...")
    ] = None,
    max_jobs: Annotated[
        int | None, Opt("--max-jobs", help="Only the first N jobs in arrival order.", min=1)
    ] = None,
    grid: Annotated[str | None, Opt("--grid", help="Carbon signal: any grid source.")] = None,
    price: Annotated[str | None, Opt("--price", help="Price signal: any grid source.")] = None,
    gpus: Annotated[int | None, Opt("--gpus", help="Cluster size in GPUs.", min=1)] = None,
    cluster: Annotated[
        Path | None, Opt("--cluster", help="Cluster TOML ([cluster] and/or [[nodes]]).")
    ] = None,
    deadline_rule: Annotated[
        str | None,
        Opt("--deadline-rule", help="none, within:24h, next-workday or semi-weekly."),
    ] = None,
    interruptible: Annotated[
        float | None,
        Opt("--interruptible", help="Share of jobs that may be suspended (0-1).", min=0, max=1),
    ] = None,
    checkpoint_cost: Annotated[
        str | None,
        Opt(
            "--checkpoint-cost",
            help="Run time the planners count a suspension to cost each interruptible "
            "job, e.g. 10m (0 to 1d; default 5m); each resumed attempt loses it.",
        ),
    ] = None,
    seed: Annotated[int | None, Opt("--seed", help="Seed for synthetic data and noise.")] = None,
    skip_jobs: Annotated[
        int | None, Opt("--skip-jobs", help="Leave out the first N jobs in arrival order.", min=0)
    ] = None,
    budget: Annotated[
        str | None,
        Opt(
            "--budget",
            help="Carbon or energy budget: 20kg/day, 150kg/week, 2t/month, 500kg, 500kWh/day.",
        ),
    ] = None,
    objective: Annotated[
        str | None, Opt("--objective", help="carbon, cost or mix:W (W: carbon's weight).")
    ] = None,
    power_limit: Annotated[
        str | None,
        Opt("--power-limit", help="Site limit, jobs and idle: 15kW, 800W, 1.5MW."),
    ] = None,
    elastic: Annotated[
        float | None,
        Opt("--elastic", help="Share of jobs that may run on ½-2× their GPUs (0-1).", min=0, max=1),
    ] = None,
    share: Annotated[
        float | None,
        Opt("--share", help="Share of jobs that may run two to a GPU (0-1).", min=0, max=1),
    ] = None,
    slot: Annotated[str | None, Opt("--slot", help="The planners' slot, e.g. 15m.")] = None,
    backfill: Annotated[
        str | None,
        Opt("--backfill", help="conservative (default), easy or strict (no backfill)."),
    ] = None,
    time_limit: Annotated[
        str | None, Opt("--time-limit", help="optimal's solver limit per replan, e.g. 30s.")
    ] = None,
) -> None:
    """Replay jobs against a historical (or synthetic) grid signal under each policy."""
    from orchestrator.cli.render import print_json
    from orchestrator.sim.runner import simulate as run
    from orchestrator.sim.scenario import (
        load_cluster_file,
        load_scenario,
        resolve_path,
        validate,
    )

    if gpus is not None and cluster is not None:
        raise typer.BadParameter("give --gpus or --cluster, not both")
    loaded, base = load_scenario(scenario)
    raw = loaded.model_dump(exclude_unset=True)
    cwd = Path.cwd()

    flags: dict[tuple, str] = {}  # key path -> the flag that set it (errors name it)

    def put(section: str | None, key: str, value, flag: str = "") -> None:
        if value is None:
            return
        (raw.setdefault(section, {}) if section else raw)[key] = value
        flags[(section, key) if section else (key,)] = flag or "--" + key.replace("_", "-")

    # Flags win over the file; paths given as flags are relative to where you are.
    put(
        None,
        "policies",
        [p for p in policy.split(",") if p.strip()] if policy else None,
        "--policy",
    )
    put(None, "forecast", forecast)
    put(None, "seed", seed)
    put("jobs", "source", resolve_path(jobs, cwd) if jobs else None, "--jobs")
    put("jobs", "max_jobs", max_jobs)
    put("jobs", "skip_jobs", skip_jobs)
    put("jobs", "elastic", elastic)
    put("jobs", "share", share)
    put(None, "budget", budget)
    put(None, "objective", objective)
    put(None, "power_limit_w", power_limit, "--power-limit")
    put(None, "slot", slot)
    put(None, "backfill", backfill)
    put(None, "time_limit", time_limit)
    put("jobs", "deadline_rule", deadline_rule)
    put("jobs", "interruptible", interruptible)
    put("jobs", "checkpoint_cost", checkpoint_cost)
    put("grid", "source", resolve_path(grid, cwd) if grid else None, "--grid")
    put("grid", "price", resolve_path(price, cwd) if price else None)
    if gpus is not None:
        raw["cluster"] = {**raw.get("cluster", {}), "gpus": gpus}
        flags[("cluster", "gpus")] = "--gpus"
        raw["cluster"].pop("nodes", None)
    if cluster is not None:
        raw["cluster"] = load_cluster_file(cluster).model_dump(exclude_unset=True)
    chosen = validate(raw, str(scenario or "scenario"), flags)
    if "fifo" not in chosen.policies:
        chosen.policies.insert(0, "fifo")  # the baseline every policy is compared with

    with _progress(enabled=not as_json) as report:
        outcome = run(chosen, base, settings=_settings(ctx), progress=report)
    data = outcome.to_json()
    if plot is not None:
        from orchestrator.sim.plots import write_plots

        data["plots"] = [str(p) for p in write_plots(outcome, plot)]
    if as_json:
        print_json(data)
        return
    _table(data)


def _settings(ctx: typer.Context):
    """The queue's settings, for web grid sources (their keys and cache). A broken config
    file does not stop a what-if run on files; a web source then reports it."""
    from orchestrator.errors import GridshiftError

    try:
        return context.get(ctx).settings
    except GridshiftError:
        return None


class _progress:
    """A rich progress bar on stderr, one task per policy (off for --json or no TTY)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.bar = None
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        if not self.enabled:
            return None
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("{task.description:<16}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.bar.__enter__()
        return self.report

    def report(self, policy: str, share: float) -> None:
        if policy not in self.tasks:
            self.tasks[policy] = self.bar.add_task(policy, total=1.0)
        self.bar.update(self.tasks[policy], completed=share)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)


def _table(data: dict) -> None:
    from orchestrator.cli.output.simtext import show

    show(data)
