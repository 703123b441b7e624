"""HTTP for the adapters: an injected ``httpx.Client``, retries with exponential backoff
on 429, 5xx, timeouts and broken connections (honouring ``Retry-After``), and httpx errors
translated into ``ProviderError``. A host that cannot be reached at all (a DNS failure, a
refused connection: ``httpx.ConnectError``) fails at once, and the tries of one request
never take longer than ``max_total_s`` together: a read timeout only bounds each wait
for the next bytes (headers or a body sent a byte at a time never trip it), so a
watchdog cuts the connection when that time is up, and the body, streamed, is also
checked against it as it comes; one over ``MAX_BODY_BYTES`` is refused, even with no
Content-Length. HTTP 401/403 is ``CredentialsRefused``. A body that is not JSON, or
nested too deep to parse, is a malformed answer.

Messages name the path, never the query: it may hold a token; and a provider's answer
quoted in one has the request's secrets (token and key parameters, auth headers, the Basic
password) cut out, should the provider echo them."""

from __future__ import annotations

import contextlib
import email.utils
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx

from grid.errors import CredentialsRefused, MissingCredentials, ProviderError, SourceSpecError

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
MAX_BODY_BYTES = 16 * 2**20  # no provider's answer is larger
ERROR_BODY_BYTES = 64 * 2**10  # read of an error answer, to quote its start
BRIEF_CHARS = 4096  # of which this much text is looked at
_FRAMING = ("content-encoding", "content-length", "transfer-encoding")  # of the stream read
#: parameters and headers whose values are secrets (compared in lower case)
SECRET_NAMES = frozenset(
    {"securitytoken", "token", "api_key", "apikey", "key", "auth-token", "authorization",
     "x-api-key", "password"}
)  # fmt: skip


class HttpApi:
    """GET with retries against one provider."""

    name = "http"

    def __init__(
        self,
        client: httpx.Client,
        base_url: str,
        *,
        retries: int = 4,
        backoff_s: float = 1.0,
        max_wait_s: float = 60.0,
        max_total_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_wait_s = max_wait_s
        self.max_total_s = max_total_s
        self.sleep = sleep
        self.clock = clock

    def get(
        self,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        auth=None,
    ) -> httpx.Response:
        """The answer to a GET of ``path``, its body read whole (at most
        ``MAX_BODY_BYTES``, before ``max_total_s`` is up)."""
        url = f"{self.base_url}{path}"
        path = path or "/"  # for messages
        secrets = _secrets(params, headers, auth)
        started = self.clock()
        deadline = started + self.max_total_s
        last, tries, out_of_time = "", 0, False
        headers = {**(headers or {}), "Connection": "close"}  # a new connection a request
        for attempt in range(self.retries + 1):
            tries += 1
            watchdog = _Watchdog(deadline - self.clock())
            try:
                with self.client.stream(
                    "GET", url, params=params, headers=headers, auth=auth,
                    extensions={"trace": watchdog.trace}, **self._timeout(deadline - self.clock()),
                ) as response:  # fmt: skip
                    if response.status_code < 400:
                        return _whole(response, self._body(response, path, deadline))
                    self._refuse(response, path, deadline, secrets)  # unless worth a retry
                    last, wait_s = f"HTTP {response.status_code}", self._wait_s(response, attempt)
            except httpx.ConnectError as exc:  # DNS failure, connection refused: no retry
                reason = scrub(str(exc) or type(exc).__name__, secrets)
                raise ProviderError(f"{self.name}: {path} cannot be reached ({reason})") from None
            except httpx.TransportError as exc:  # timeouts included
                if watchdog.fired:
                    raise self._too_slow(path) from None
                timed_out = isinstance(exc, httpx.TimeoutException)
                last = "timed out" if timed_out else f"connection failed ({type(exc).__name__})"
                wait_s = self._backoff_s(attempt)
            except httpx.DecodingError:  # a body its Content-Encoding does not describe
                raise ProviderError(f"{self.name}: {path} answered an undecodable body") from None
            except httpx.InvalidURL:
                raise SourceSpecError(
                    f"{self.name}: the base URL {self.base_url[:100]!r} is not a URL"
                ) from None
            finally:
                watchdog.cancel()
            if attempt == self.retries:
                break
            if self.clock() - started + wait_s >= self.max_total_s:
                out_of_time = True  # another try would end past the time limit
                break
            self.sleep(wait_s)
        times = "1 try" if tries == 1 else f"{tries} tries"
        limit = f", time limit {self.max_total_s:g} s" if out_of_time else ""
        raise ProviderError(f"{self.name}: {path} failed after {times} ({last}{limit})")

    def _body(self, response: httpx.Response, path: str, deadline: float) -> bytes:
        """The whole body, or a ``ProviderError`` when it is larger than
        ``MAX_BODY_BYTES`` or still coming at ``deadline`` (a read timeout bounds each
        wait for the next bytes; this bounds a body that drips)."""
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise self._too_big(path)
        chunks, size = [], 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise self._too_big(path)
            chunks.append(chunk)
            if self.clock() > deadline:
                raise self._too_slow(path)
        return b"".join(chunks)

    def _too_slow(self, path: str) -> ProviderError:
        return ProviderError(
            f"{self.name}: {path} did not finish answering within {self.max_total_s:g} s"
        )

    def _too_big(self, path: str) -> ProviderError:
        return ProviderError(
            f"{self.name}: {path} answered more than {MAX_BODY_BYTES // 2**20} MiB"
        )

    def _refuse(
        self, response: httpx.Response, path: str, deadline: float, secrets: list[str]
    ) -> None:
        """Raise for an error status not worth a retry (quoting at most the start of the
        answer); return for one that is (429, 5xx)."""
        if response.status_code in (401, 403):
            raise CredentialsRefused(
                f"{self.name}: {path} refused the credentials (HTTP "
                f"{response.status_code}); check the key in the settings"
            )
        if response.status_code not in RETRY_STATUS:
            head = _whole(response, _head(response, deadline, self.clock))
            raise ProviderError(
                f"{self.name}: {path} answered HTTP {response.status_code}: {_brief(head, secrets)}"
            )

    def _timeout(self, left_s: float) -> dict[str, httpx.Timeout]:
        """The client's timeouts, each cut to the time left (none when all fit)."""
        current = getattr(self.client, "timeout", None)
        if current is None:
            return {}
        parts = {"connect": current.connect, "read": current.read,
                 "write": current.write, "pool": current.pool}  # fmt: skip
        if all(v is not None and v <= left_s for v in parts.values()):
            return {}
        left_s = max(0.05, left_s)
        cut = {k: left_s if v is None else min(v, left_s) for k, v in parts.items()}
        return {"timeout": httpx.Timeout(**cut)}

    def _backoff_s(self, attempt: int) -> float:
        return min(self.max_wait_s, self.backoff_s * 2**attempt)

    def get_json(self, path: str, **kwargs) -> Any:
        response = self.get(path, **kwargs)
        try:
            return response.json()
        except (ValueError, RecursionError, MemoryError):  # "[" * 10**5: RecursionError
            raise ProviderError(f"{self.name}: {path} answered malformed JSON") from None

    def _wait_s(self, response: httpx.Response, attempt: int) -> float:
        header = response.headers.get("Retry-After")
        wait = self.backoff_s * 2**attempt
        if header:
            try:
                wait = float(header)
            except ValueError:
                try:  # an HTTP date; anything else: the backoff
                    when = email.utils.parsedate_to_datetime(header)
                    wait = (when - datetime.now(UTC)).total_seconds()
                except (TypeError, ValueError, IndexError):
                    pass
        if wait != wait:  # NaN
            wait = self.backoff_s * 2**attempt
        return max(0.0, min(self.max_wait_s, wait))


def _secrets(params, headers, auth) -> list[str]:
    """The secret values a request carries (to cut out of messages)."""
    found = [
        str(value)
        for pairs in (params or {}, headers or {})
        for name, value in pairs.items()
        if name.lower() in SECRET_NAMES and value
    ]
    found += [word for value in list(found) for word in str(value).split()[1:]]  # "Bearer x"
    if isinstance(auth, httpx.BasicAuth):  # its header: the base64 of user:password
        found.append(getattr(auth, "_auth_header", "").split(" ")[-1])
    elif isinstance(auth, tuple) and len(auth) == 2:
        found.append(str(auth[1]))
    return found


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with each secret (of 4 characters or more: shorter ones are too common
    to cut) replaced by ``***``."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


class _Watchdog:
    """Cuts a request's connection when its time is up (``left_s`` from now): a read
    timeout only bounds each wait for the next bytes, so headers or a body sent a byte at
    a time would never end otherwise. Armed when the connection is made (httpcore's trace
    hands over the socket; each request makes its own: ``Connection: close``); a
    transport with no socket (a test's mock) is never cut."""

    def __init__(self, left_s: float) -> None:
        self.left_s = max(0.0, left_s)
        self.made = time.monotonic()
        self.fired = False
        self._timer: threading.Timer | None = None

    def trace(self, event: str, info: dict) -> None:
        if event != "connection.connect_tcp.complete" or self._timer is not None:
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            wait_s = max(0.0, self.left_s - (time.monotonic() - self.made))
            self._timer = threading.Timer(wait_s, self._cut, (sock,))
            self._timer.daemon = True
            self._timer.start()

    def _cut(self, sock: socket.socket) -> None:
        self.fired = True
        with contextlib.suppress(OSError):  # a blocked read returns at once
            sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def _head(response: httpx.Response, deadline: float, clock: Callable[[], float]) -> bytes:
    """The start of an error answer (``ERROR_BODY_BYTES`` at most, what came by
    ``deadline``): enough to quote."""
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= ERROR_BODY_BYTES or clock() > deadline:
            break
    return b"".join(chunks)[:ERROR_BODY_BYTES]


def _whole(response: httpx.Response, body: bytes) -> httpx.Response:
    """A response holding ``body`` (already decoded) in place of the stream."""
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _FRAMING]
    kept = {k: v for k, v in response.extensions.items() if k in ("http_version", "reason_phrase")}
    return httpx.Response(
        response.status_code, headers=headers, content=body, request=response.request,
        extensions=kept,
    )  # fmt: skip


def _brief(response: httpx.Response, secrets: list[str] = ()) -> str:
    text = scrub(" ".join(response.text[:BRIEF_CHARS].split()), list(secrets))
    return text[:160] or response.reason_phrase


def need(value: str | None, what: str, setting: str) -> str:
    if not value:
        raise MissingCredentials(f"{what} is not set (setting {setting})")
    return value


def shape_error(source: str, what: str) -> ProviderError:
    return ProviderError(f"{source}: unexpected response shape ({what})")
