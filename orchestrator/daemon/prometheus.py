"""Optional Prometheus metrics (``gridshift daemon --metrics-port N``; needs the
``prometheus-client`` package: ``pip install 'gridshift[metrics]'``). They listen on
127.0.0.1 unless ``metrics_addr`` (``--metrics-addr``) names another address."""

from __future__ import annotations

from orchestrator.errors import ConfigError


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
