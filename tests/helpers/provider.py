"""A grid provider on 127.0.0.1 for the tests: a real threaded HTTP server answering in
the UK Carbon Intensity API's shape (national ``/intensity/...`` and regional
``/regional/intensity/...``, ranges and ``fw24h``/``fw48h`` forecasts), which a test
makes fail: an HTTP status for some paths (with a body of its own), garbage values, a
malformed body, a delay before each answer, a body (or the whole answer, headers
included) sent in pieces (one byte at a time, slowly: ``drip``) or without a
Content-Length, and rows added to each answer (a point far
in the future). It records the paths it was asked for."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLOT = timedelta(minutes=30)


class ProviderServer:
    def __init__(self) -> None:
        self.requests: list[str] = []
        self.status: dict[str, int] = {}  # path prefix -> HTTP status to answer
        self.delay_s = 0.0  # before each answer
        self.body: bytes | None = None  # answered instead of the data, when set
        self.error_body = b""  # answered with a status other than 200
        self.pieces: Callable[[bytes], Iterable[bytes]] | None = None  # the body, sent so
        self.content_length = True  # False: none sent, the body ends when the connection does
        self.head_in_pieces = False  # True: the status line and headers are sent so, too
        self.extra_rows: list[dict] = []  # added to the rows of each answer
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
                body = provider.error_body if status != 200 else provider.answer(self.path)
                reason = self.responses.get(status, ("",))[0]
                head = f"HTTP/1.0 {status} {reason}\r\nContent-Type: application/json\r\n"
                if provider.content_length:
                    head += f"Content-Length: {len(body)}\r\n"
                answer = body
                try:
                    if provider.head_in_pieces:  # the whole answer, head and body, in pieces
                        answer = head.encode() + b"\r\n" + body
                    else:  # the head at once, the body as asked
                        self.wfile.write(head.encode() + b"\r\n")
                    for piece in provider.pieces(answer) if provider.pieces else [answer]:
                        self.wfile.write(piece)
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
        rows += self.extra_rows
        data = {"regionid": 13, "shortname": "London", "data": rows} if regional else rows
        return json.dumps({"data": data}).encode()


def drip(every_s: float) -> Callable[[bytes], Iterable[bytes]]:
    """``ProviderServer.pieces`` that sends a body one byte every ``every_s`` seconds."""

    def pieces(body: bytes) -> Iterable[bytes]:
        for i in range(len(body)):
            time.sleep(every_s)
            yield body[i : i + 1]

    return pieces


def _floor(t: datetime) -> datetime:
    t = t.astimezone(UTC)
    return t.replace(minute=30 if t.minute >= 30 else 0, second=0, microsecond=0)
