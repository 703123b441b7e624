"""Source specs as people write them: ``uk``, ``uk:region=13``, ``electricitymaps:DE``,
``watttime:CAISO_NORTH``, ``energy-charts:DE``, ``entsoe:DE-LU``, ``carbon-aware:westus``,
``csv:PATH?column=...``, ``synthetic:mean=300&days=28``. Options after ``?`` (or
``key=value`` in place of the zone)."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from grid.errors import SourceSpecError

KNOWN = (
    "uk",
    "electricitymaps",
    "watttime",
    "energy-charts",
    "entsoe",
    "carbon-aware",
    "csv",
    "synthetic",
)


@dataclass(frozen=True)
class SourceSpec:
    name: str
    target: str | None  # zone, region or path
    options: dict[str, str] = field(default_factory=dict)
    text: str = ""


def parse_source(text: str) -> SourceSpec:
    raw = text.strip()
    name, _, rest = raw.partition(":")
    name = name.lower()
    if name not in KNOWN:
        raise SourceSpecError(f"unknown grid source {name!r}; known: {', '.join(KNOWN)}")
    target, _, query = rest.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=False))
    if target and "=" in target and name != "csv":  # synthetic:mean=300&days=7
        options.update(parse_qsl(target))
        target = ""
    return SourceSpec(name=name, target=target or None, options=options, text=raw)
