"""The daemon's health, written to the database for ``gridshift status``: last pass,
signal age and source, the fallback in force, running jobs and GPUs, the budget. And the
same figures as optional Prometheus metrics (``gridshift daemon --metrics-port N``; needs
the ``prometheus-client`` package: ``pip install 'gridshift[metrics]'``), which listen on
127.0.0.1 unless ``metrics_addr`` (``--metrics-addr``) names another address."""

from __future__ import annotations

import os
from datetime import UTC, datetime

from sqlmodel import col, func, select

from orchestrator.errors import ConfigError
from orchestrator.queue.attempts import ON_GPU, AttemptState, gpus_held, values
from orchestrator.queue.models import Attempt, Health, Job
from orchestrator.queue.states import JobState
from orchestrator.signals.feed import trace_end

WRITE_EVERY_S = 1.0


class HealthWriter:
    def __init__(self, daemon) -> None:
        self.daemon = daemon
        self.started_at = datetime.now(UTC)
        self.data: dict = {}
        self._last = 0.0

    def write(self, now: datetime, stopped: bool = False) -> None:
        if not stopped and now.timestamp() - self._last < WRITE_EVERY_S:
            return
        self._last = now.timestamp()
        db = self.daemon.db
        with db.read() as session:
            self.data = self._collect(session, now, stopped)
        with db.write() as session:
            row = session.get(Health, 1) or Health(
                id=1, pid=os.getpid(), started_at=self.started_at, last_tick=now
            )
            row.pid, row.started_at, row.last_tick = os.getpid(), self.started_at, now
            row.data = self.data
            session.add(row)

    def _collect(self, session, now: datetime, stopped: bool) -> dict:
        daemon = self.daemon
        planner = daemon.planner
        running = session.exec(select(Attempt).where(col(Attempt.state).in_(values(ON_GPU)))).all()
        queued = session.exec(
            select(func.count()).select_from(Job).where(Job.state == JobState.QUEUED.value)
        ).one()
        meters = daemon.reaper.accountant
        power = _power_view(getattr(daemon, "levers", None))
        data = {
            "stopped": stopped,
            "policy": daemon.policy_name,
            "mode": planner.mode if planner else "plan",
            "fallback_reason": planner.mode_reason if planner else None,
            "slot_s": planner.slot_s if planner else None,
            "suspend": daemon.suspender.mode,
            "power_caps": daemon.caps.enabled,
            "power_caps_reason": daemon.caps.reason,
            "power_limit": _site(getattr(daemon, "site", None)),
            "queued_jobs": int(queued),
            "running_jobs": sum(1 for a in running if a.state == AttemptState.RUNNING),
            "stopped_jobs": sum(1 for a in running if a.state == AttemptState.STOPPED),
            # distinct GPUs: two jobs sharing one (co-location) hold it once
            "running_gpus": gpus_held(a for a in running if a.state == AttemptState.RUNNING),
            "power_w": round(sum(meters.power_w(a.id) or 0.0 for a in running), 1),
            "signal": None,
            "budget": None,
            "nodes_unreachable": unreachable(daemon.executor.unreachable_nodes(), power),
            # right-sizing: each managed server's power (off, waking, wake failed ...)
            "nodes_power": power,
        }
        feed = planner.feed if planner else None
        if feed is not None:
            age = feed.age_s(now)
            data["signal"] = {
                "source": feed.chain.spec,
                "age_s": None if age is None else round(age, 1),
                "g_per_kwh": _round(feed.now_value(now)),
                "error": feed.last_error,
                "failing_since": _iso(feed.failing_since),
                "trace_end": _iso(trace_end(feed.chain)) if feed.last_error else None,
            }
        data["settings"] = effective_settings(daemon)
        if planner is not None and planner.budget is not None:
            from orchestrator.accounting.meter import spent_g

            start, end = planner.budget_window(now)
            spent = spent_g(session, start, end, planner.budget.kind)
            data["budget"] = {
                "budget": str(planner.budget),
                "unit": planner.budget.unit,
                "period_start": start.isoformat(),
                "period_end": end.isoformat(),
                "spent_g": round(spent, 3),
                "remaining_g": round(max(0.0, planner.budget.grams - spent), 3),
            }
        return data


def effective_settings(daemon) -> dict:
    """What the daemon runs with (its options over the config file's), for ``budget``,
    ``report`` and ``status`` to default to: grid and price sources, budget, policy."""
    cfg = daemon.settings.daemon
    return {
        "grid": list(cfg.grid or daemon.settings.grid.source or []),
        "price": cfg.price,
        "budget": cfg.budget,
        "policy": daemon.policy_name,
        "objective": cfg.objective,
    }


def unreachable(down: dict[str, float], power: dict[str, dict]) -> dict[str, str]:
    """``nodes_unreachable``: the nodes that do not answer (name -> since, ISO, UTC) while
    on. One right-sizing has off, powering off, waking or wake failed is not: it is in
    ``nodes_power`` with its state, as ``status`` shows it."""
    return {
        node: datetime.fromtimestamp(since, UTC).isoformat()
        for node, since in sorted(down.items())
        if (power.get(node) or {}).get("power_state", "on") == "on"
    }


def _power_view(levers) -> dict:
    return levers.power_view() if levers is not None else {}


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


class Metrics:
    def __init__(self, port: int, addr: str = "127.0.0.1") -> None:
        try:
            from prometheus_client import CollectorRegistry, Gauge, start_http_server
        except ImportError:
            raise ConfigError(
                "--metrics-port needs prometheus-client: pip install 'gridshift[metrics]'"
            ) from None
        self.registry = CollectorRegistry()

        def gauge(name: str, text: str):
            return Gauge(f"gridshift_{name}", text, registry=self.registry)

        self.queue = gauge("queue_length", "Jobs queued")
        self.running = gauge("running_jobs", "Jobs running")
        self.gpus = gauge("running_gpus", "GPUs held by running jobs")
        self.power = gauge("power_watts", "GPU power of running jobs, measured or modelled")
        self.intensity = gauge("carbon_intensity_g_per_kwh", "Grid carbon intensity now")
        self.signal_age = gauge("signal_age_seconds", "Age of the grid signal")
        self.budget_left = gauge("budget_remaining_grams", "Carbon budget left this period")
        try:
            self.server, self.thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"--metrics-port {port} on {addr}: {exc.strerror}") from None

    def update(self, data: dict) -> None:
        self.queue.set(data.get("queued_jobs", 0))
        self.running.set(data.get("running_jobs", 0))
        self.gpus.set(data.get("running_gpus", 0))
        self.power.set(data.get("power_w") or 0.0)
        signal = data.get("signal") or {}
        if signal.get("g_per_kwh") is not None:
            self.intensity.set(signal["g_per_kwh"])
        if signal.get("age_s") is not None:
            self.signal_age.set(signal["age_s"])
        budget = data.get("budget") or {}
        if budget.get("remaining_g") is not None:
            self.budget_left.set(budget["remaining_g"])


def _site(site) -> dict | None:
    """The site power limit and the sum of the GPU limits in force (``status``)."""
    if site is None:
        return None
    return {"limit_w": site.limit_w, "in_force_w": site.in_force_w(), "gpus": len(site.gpus)}
