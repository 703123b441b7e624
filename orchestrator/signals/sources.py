"""The orchestrator's door to ``grid``: settings to providers, specs to a cached chain."""

from __future__ import annotations

from orchestrator.errors import SpecError
from orchestrator.settings import Settings
from orchestrator.signals.redact import remember


def provider_configs(settings: Settings) -> dict:
    from grid.registry import ProviderConfig

    configs = {}
    for name in ("uk", "electricitymaps", "watttime", "energy-charts", "entsoe", "carbon-aware"):
        p = getattr(settings.grid, name.replace("-", "_"))
        configs[name] = ProviderConfig(
            base_url=p.base_url,
            api_key=p.api_key.get_secret_value() if p.api_key else None,
            username=p.username,
            password=p.password.get_secret_value() if p.password else None,
        )
        remember(configs[name].api_key, configs[name].password)  # never in a log line
    return configs


def open_chain(settings: Settings, specs: list[str], client=None, flag: str = "--source"):
    """The sources named by ``specs`` (or the configured chain), tried in order, with the
    file cache under GRIDSHIFT_HOME behind them; with neither, an error that names ``flag``,
    the caller's option for a source."""
    import httpx

    from grid.cache import CachedChain, SignalCache
    from grid.registry import build_source

    specs = specs or settings.grid.source
    if not specs:
        raise SpecError(f"no grid source: give {flag} (e.g. uk, csv:PATH) or set grid.source")
    client = client or httpx.Client(
        timeout=settings.grid.timeout_s, headers={"User-Agent": "gridshift"}
    )
    configs = provider_configs(settings)
    sources = [build_source(s, configs, client, retries=settings.grid.retries) for s in specs]
    cache = SignalCache(settings.grid_cache_dir) if settings.grid.cache else None
    return CachedChain(sources, cache)
