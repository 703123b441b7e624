"""ENTSO-E Transparency Platform: day-ahead prices (document A44), XML. Each
``TimeSeries/Period`` has a start, a resolution (PT60M, PT15M ...) and numbered points;
with curve type A03 a point that repeats the previous price is left out, so missing
positions are forward-filled. Requests go in chunks of at most 30 days."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta

from grid.errors import ProviderError, SourceSpecError
from grid.http import HttpApi, scrub, shape_error
from grid.resample import MAX_POINTS
from grid.signal import PRICE, Signal
from grid.sources.base import GridSource, Row, chunks, number, row_time

BASE_URL = "https://web-api.tp.entsoe.eu/api"
MAX_SPAN = timedelta(days=30)
EIC = {
    "DE-LU": "10Y1001A1001A82H",
    "FR": "10YFR-RTE------C",
    "NL": "10YNL----------L",
    "BE": "10YBE----------2",
    "AT": "10YAT-APG------L",
    "ES": "10YES-REE------0",
    "PT": "10YPT-REN------W",
    "CH": "10YCH-SWISSGRIDZ",
    "PL": "10YPL-AREA-----S",
    "CZ": "10YCZ-CEPS-----N",
    "DK-1": "10YDK-1--------W",
    "DK-2": "10YDK-2--------M",
    "NO-1": "10YNO-1--------2",
    "SE-3": "10Y1001A1001A46L",
    "FI": "10YFI-1--------U",
    "IT-NORTH": "10Y1001A1001A73I",
}
_RESOLUTION = re.compile(r"^PT(?:(\d+)H)?(?:(\d+)M)?$")


def eic_code(zone: str) -> str:
    if zone.upper().startswith("10Y"):
        return zone
    try:
        return EIC[zone.upper()]
    except KeyError:
        raise SourceSpecError(
            f"entsoe: unknown zone {zone!r}; known: {', '.join(EIC)} (or give an EIC code)"
        ) from None


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _find(node: ET.Element, name: str) -> ET.Element | None:
    return next((c for c in node.iter() if _local(c.tag) == name), None)


def parse_a44(xml_text: str) -> list[Row]:
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise ProviderError(f"entsoe: malformed XML ({exc})") from None
    if _local(root.tag) == "Acknowledgement_MarketDocument":
        reason = _find(root, "text")
        raise ProviderError(f"entsoe: {reason.text if reason is not None else 'no data'}")
    rows: list[Row] = []
    for period in (n for n in root.iter() if _local(n.tag) == "Period"):
        start_el, res_el = _find(period, "start"), _find(period, "resolution")
        end_el = _find(period, "end")
        if start_el is None or res_el is None or end_el is None:
            raise shape_error("entsoe", "Period without timeInterval or resolution")
        match = _RESOLUTION.match(res_el.text or "")
        if not match:
            raise shape_error("entsoe", f"resolution {res_el.text!r}")
        step = timedelta(hours=int(match.group(1) or 0), minutes=int(match.group(2) or 0))
        start, end = row_time(start_el.text, "entsoe"), row_time(end_el.text, "entsoe")
        count = int((end - start) / step) if step else -1
        if not 0 <= count <= MAX_POINTS:
            raise shape_error("entsoe", f"a period of {count} points")
        prices: dict[int, float] = {}
        for point in (n for n in period if _local(n.tag) == "Point"):
            pos, amount = _find(point, "position"), _find(point, "price.amount")
            if pos is not None and amount is not None and (pos.text or "").strip().isdigit():
                prices[int(pos.text)] = number(amount.text)  # garbage: unknown (NaN)
        last = None
        for position in range(1, count + 1):
            last = prices.get(position, last)  # A03: a missing point repeats the last
            rows.append((start + (position - 1) * step, last, False))
    return rows


class Entsoe(GridSource):
    name = "entsoe"
    quantity, unit, kind, basis, currency = PRICE, "EUR/MWh", None, None, "EUR"

    def __init__(self, spec: str, api: HttpApi, zone: str, token: str) -> None:
        super().__init__(spec, zone.upper())
        self.api = api
        self.api.name = "entsoe"
        self.domain = eic_code(zone)
        self._token = token

    def history(self, start: datetime, end: datetime) -> Signal:
        rows: list[Row] = []
        for a, b in chunks(start, end, MAX_SPAN):
            params = {
                "securityToken": self._token,
                "documentType": "A44",
                "in_Domain": self.domain,
                "out_Domain": self.domain,
                "contract_MarketAgreement.type": "A01",
                "periodStart": a.strftime("%Y%m%d%H%M"),
                "periodEnd": b.strftime("%Y%m%d%H%M"),
            }
            try:
                rows += parse_a44(self.api.get("", params=params).text)
            except ProviderError as exc:  # its acknowledgement might quote the request
                raise ProviderError(scrub(str(exc), [self._token])) from None
        return self.signal(rows, start=start, end=end)

    def forecast(self, issued_at: datetime, horizon: timedelta) -> Signal:
        """Day-ahead prices are published for tomorrow: the auction is the forecast."""
        signal = self.history(issued_at, issued_at + horizon)
        frame = signal.frame.assign(forecast=True)
        return Signal(frame, signal.meta).with_meta(issued_at=issued_at)
