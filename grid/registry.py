"""From a source spec and the providers' settings to a ``GridSource``."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from grid.errors import SourceSpecError
from grid.http import HttpApi, need
from grid.sources import carbonaware, electricitymaps, energycharts, entsoe, uk, watttime
from grid.sources.base import GridSource
from grid.sources.csvtrace import CsvTrace
from grid.sources.synthetic import Synthetic
from grid.spec import parse_source

DEFAULT_BASE_URLS = {
    "uk": uk.BASE_URL,
    "electricitymaps": electricitymaps.BASE_URL,
    "watttime": watttime.BASE_URL,
    "energy-charts": energycharts.BASE_URL,
    "entsoe": entsoe.BASE_URL,
    "carbon-aware": carbonaware.BASE_URL,
}
#: What each provider needs besides a base URL.
CREDENTIALS = {
    "uk": (),
    "electricitymaps": ("api_key",),
    "watttime": ("username", "password"),
    "energy-charts": (),
    "entsoe": ("api_key",),
    "carbon-aware": (),
    "csv": (),
    "synthetic": (),
}


@dataclass(frozen=True)
class ProviderConfig:
    """One provider's settings. Secrets are kept out of ``repr``."""

    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def has_credentials(self, name: str) -> bool:
        return all(getattr(self, attr) for attr in CREDENTIALS[name])


def build_source(
    text: str, providers: dict[str, ProviderConfig], client: httpx.Client, **http_options
) -> GridSource:
    spec = parse_source(text)
    cfg = providers.get(spec.name) or ProviderConfig()
    prefix = f"GRIDSHIFT_GRID__{spec.name.upper().replace('-', '_')}"
    if spec.name == "csv":
        if not spec.target:
            raise SourceSpecError("csv: give a path, e.g. csv:data/DE_2023_hourly.csv")
        return CsvTrace(spec.text, spec.target, spec.options)
    if spec.name == "synthetic":
        return Synthetic(spec.text, spec.options)
    api = HttpApi(client, cfg.base_url or DEFAULT_BASE_URLS[spec.name], **http_options)
    opts = spec.options
    if spec.name == "uk":
        region = opts.get("region")
        if region is not None and not region.isdigit():
            raise SourceSpecError(f"uk: region must be a number (1-17), not {region!r}")
        return uk.UkCarbonIntensity(spec.text, api, int(region) if region else None)
    zone = _zone(spec.name, spec.target)
    if spec.name == "electricitymaps":
        key = need(cfg.api_key, "the Electricity Maps API key", f"{prefix}__API_KEY")
        return electricitymaps.ElectricityMaps(
            spec.text, api, zone, key, basis=opts.get("basis", "lifecycle")
        )
    if spec.name == "watttime":
        user = need(cfg.username, "the WattTime username", f"{prefix}__USERNAME")
        password = need(cfg.password, "the WattTime password", f"{prefix}__PASSWORD")
        return watttime.WattTime(
            spec.text, api, zone, user, password, signal_type=opts.get("signal_type", "co2_moer")
        )
    if spec.name == "energy-charts":
        return energycharts.EnergyCharts(spec.text, api, zone, opts.get("signal", "carbon"))
    if spec.name == "entsoe":
        token = need(cfg.api_key, "the ENTSO-E security token", f"{prefix}__API_KEY")
        return entsoe.Entsoe(spec.text, api, zone, token)
    return carbonaware.CarbonAwareSdk(spec.text, api, zone)


def _zone(name: str, target: str | None) -> str:
    if not target:
        raise SourceSpecError(
            f"{name}: give a zone or region, e.g. {name}:"
            f"{'CAISO_NORTH' if name == 'watttime' else 'DE'}"
        )
    return target
