"""Recorded-shape provider responses and a MockTransport router for the grid tests."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx


class Router:
    """Answers requests from a list of (predicate, response) rules; records each request."""

    def __init__(self) -> None:
        self.rules: list[tuple[Callable[[httpx.Request], bool], Callable]] = []
        self.requests: list[httpx.Request] = []

    def on(self, path_part: str, *responses, when=None) -> Router:
        queue = list(responses)

        def respond(request):
            item = queue.pop(0) if len(queue) > 1 else queue[0]
            return item(request) if callable(item) else item

        self.rules.append(
            (lambda r: path_part in r.url.path and (when is None or when(r)), respond)
        )
        return self

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        for match, respond in self.rules:
            if match(request):
                return respond(request)
        return httpx.Response(404, text="no route")

    def client(self) -> httpx.Client:
        return httpx.Client(transport=httpx.MockTransport(self))


def ok(payload) -> httpx.Response:
    return httpx.Response(
        200, text=json.dumps(payload), headers={"content-type": "application/json"}
    )


def uk_rows(start_hour: int, count: int, day: str = "2023-06-01", actual=True) -> list[dict]:
    rows = []
    for i in range(count):
        h, m = divmod(start_hour * 60 + 30 * i, 60)
        h2, m2 = divmod(start_hour * 60 + 30 * (i + 1), 60)
        rows.append(
            {
                "from": f"{day}T{h:02d}:{m:02d}Z",
                "to": f"{day}T{h2:02d}:{m2:02d}Z",
                "intensity": {
                    "forecast": 200 + i,
                    "actual": (100 + i) if actual else None,
                    "index": "moderate",
                },
            }
        )
    return rows
