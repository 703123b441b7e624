"""A grid provider on 127.0.0.1 for the tests: a real threaded HTTP server answering in
the UK Carbon Intensity API's shape (national ``/intensity/...`` and regional
``/regional/intensity/...``, ranges and ``fw24h``/``fw48h`` forecasts), which a test
makes fail: an HTTP status for some paths, garbage values, a malformed body, a delay
before each answer. It records the paths it was asked for."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLOT = timedelta(minutes=30)


class ProviderServer:
    def __init__(self) -> None:
        self.requests: list[str] = []
        self.status: dict[str, int] = {}  # path prefix -> HTTP status to answer
        self.delay_s = 0.0  # before each answer
        self.body: bytes | None = None  # answered instead of the data, when set
        self.value: Callable[[datetime], object] = lambda t: 200 + t.hour  # each row's
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> ProviderServer:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                provider.requests.append(self.path)
                if provider.delay_s:
                    time.sleep(provider.delay_s)
                status = next(
                    (code for prefix, code in provider.status.items()
                     if self.path.startswith(prefix)), 200,
                )  # fmt: skip
                body = b"" if status != 200 else provider.answer(self.path)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up waiting

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        serve = lambda: self._server.serve_forever(poll_interval=0.05)  # noqa: E731
        threading.Thread(target=serve, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def answer(self, path: str) -> bytes:
        """UK-shaped rows for the range or forecast ``path`` asks for."""
        if self.body is not None:
            return self.body
        parts = path.split("?")[0].strip("/").split("/")
        regional = parts[0] == "regional"
        frm, to = parts[1 + regional], parts[2 + regional]
        start = _floor(datetime.fromisoformat(frm.replace("Z", "+00:00")) - timedelta(minutes=1))
        if to.startswith("fw"):
            end = start + timedelta(hours=int(to[2:-1]))
        else:
            end = datetime.fromisoformat(to.replace("Z", "+00:00"))
        rows, t = [], start
        while t < end:
            rows.append({
                "from": t.strftime("%Y-%m-%dT%H:%MZ"),
                "to": (t + SLOT).strftime("%Y-%m-%dT%H:%MZ"),
                "intensity": {"forecast": self.value(t), "actual": None, "index": "moderate"},
            })  # fmt: skip
            t += SLOT
        data = {"regionid": 13, "shortname": "London", "data": rows} if regional else rows
        return json.dumps({"data": data}).encode()


def _floor(t: datetime) -> datetime:
    t = t.astimezone(UTC)
    return t.replace(minute=30 if t.minute >= 30 else 0, second=0, microsecond=0)
