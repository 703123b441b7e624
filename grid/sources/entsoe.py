"""ENTSO-E Transparency Platform: day-ahead prices (document A44), XML. Each
``TimeSeries/Period`` has a start, a resolution (PT60M, PT15M ...) and numbered points;
with curve type A03 a point that repeats the previous price is left out, so missing
positions are forward-filled. Requests go in chunks of at most 30 days.

The answer is untrusted XML: one with a DOCTYPE (entities, external or expanding) or
nested deeper than ``MAX_DEPTH`` is refused before any element is used, only the points
of the requested range (and a day either side) are made into rows, and no more than
``MAX_ROWS`` of them (a period may claim a century; periods may overlap or nest)."""

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
_DOCTYPE = re.compile(r"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)
MAX_DEPTH = 32  # an A44 document nests 5 deep
MARGIN = timedelta(days=1)  # rows kept either side of the range asked for
#: rows one answer may make: a 30-day chunk at 1-minute resolution is 43,200
MAX_ROWS = 200_000
_FEED_CHARS = 1 << 16


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


def parse_xml(xml_text: str) -> ET.Element:
    """The document's root; a ``ProviderError`` for XML that is malformed, declares a
    DOCTYPE or nests deeper than ``MAX_DEPTH`` (read in pieces, so a deep one is refused
    before it is built)."""
    if _DOCTYPE.search(xml_text):
        raise ProviderError("entsoe: XML with a DOCTYPE or entities refused")
    parser = ET.XMLPullParser(events=("start", "end"))
    root, depth = None, 0
    try:
        for at in range(0, len(xml_text), _FEED_CHARS):
            parser.feed(xml_text[at : at + _FEED_CHARS])
            for event, element in parser.read_events():
                root = element if root is None else root
                depth += 1 if event == "start" else -1
                if depth > MAX_DEPTH:
                    raise ProviderError(f"entsoe: XML nested more than {MAX_DEPTH} deep")
        parser.close()
    except ET.ParseError as exc:
        raise ProviderError(f"entsoe: malformed XML ({exc})") from None
    except (RecursionError, MemoryError):
        raise ProviderError("entsoe: XML too large to read") from None
    if root is None:
        raise ProviderError("entsoe: malformed XML (no element)")
    return root


def parse_a44(
    xml_text: str, start: datetime | None = None, end: datetime | None = None
) -> list[Row]:
    """The rows of an A44 answer; when ``start`` and ``end`` are given, only those within
    a day of ``[start, end)`` (a margin that leaves the resolution to tell)."""
    if start is not None:
        start -= MARGIN
    if end is not None:
        end += MARGIN
    root = parse_xml(xml_text)
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
        first, last = row_time(start_el.text, "entsoe"), row_time(end_el.text, "entsoe")
        count = int((last - first) / step) if step else -1
        if not 0 <= count <= MAX_POINTS:
            raise shape_error("entsoe", f"a period of {count} points")
        prices: dict[int, float] = {}
        for point in (n for n in period if _local(n.tag) == "Point"):
            pos, amount = _find(point, "position"), _find(point, "price.amount")
            if pos is not None and amount is not None and (pos.text or "").strip().isdecimal():
                prices[int(pos.text)] = number(amount.text)  # garbage: unknown (NaN)
        lo = 1 if start is None else max(1, -((first - start) // step) + 1)
        hi = count if end is None else min(count, -((first - end) // step))
        if len(rows) + max(0, hi - lo + 1) > MAX_ROWS:
            raise shape_error("entsoe", f"more than {MAX_ROWS:,} points")
        # A03: a missing point repeats the last one given
        price = max(((p, v) for p, v in prices.items() if p <= lo), default=(0, None))[1]
        for position in range(lo, hi + 1):
            price = prices.get(position, price)
            rows.append((first + (position - 1) * step, price, False))
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
                rows += parse_a44(self.api.get("", params=params).text, a, b)
            except ProviderError as exc:  # its acknowledgement might quote the request
                raise ProviderError(scrub(str(exc), [self._token])) from None
        return self.signal(rows, start=start, end=end)

    def forecast(self, issued_at: datetime, horizon: timedelta) -> Signal:
        """Day-ahead prices are published for tomorrow: the auction is the forecast."""
        signal = self.history(issued_at, issued_at + horizon)
        frame = signal.frame.assign(forecast=True)
        return Signal(frame, signal.meta).with_meta(issued_at=issued_at)
