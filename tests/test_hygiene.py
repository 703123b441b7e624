"""Secrets and what people see (issue 19): no provider key or database password in any
log line, error or output; the metrics listen on 127.0.0.1 unless told otherwise; control
characters in names, labels and commands print escaped (and exact in ``--json``).

The provider here is an ENTSO-E look-alike on 127.0.0.1 (a real HTTP server, so the real
daemon's and CLI's httpx clients talk to it); it echoes the whole request, token and all,
in its error answers, as a careless provider might.
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from grid.errors import GridDataError
from grid.registry import ProviderConfig, build_source
from orchestrator.signals.redact import LogHygiene, guard, printable, redact
from tests.grid_fixtures import Router
from tests.helpers.waiting import free_port, wait_for

TOKEN = "entsoe-Tok3n-9f8e7d6c"
DB_PASSWORD = "db-Pa55w0rd-s3cret"
NAME = "\x1b]0;pwned\x07"
LABEL = "\x1b[2J"
ESCAPED_NAME = "\\x1b]0;pwned\\x07"
ESCAPED_LABEL = "\\x1b[2J"


# -- the redaction and escaping themselves -------------------------------------------------


@pytest.mark.parametrize(
    "text,secret",
    [
        (f"GET https://web-api.tp.entsoe.eu/api?documentType=A44&securityToken={TOKEN}", TOKEN),
        ("https://api.eia.gov/v2/x?frequency=hourly&api_key=K3y-abcdef", "K3y-abcdef"),
        ("https://x.test/v1?apikey=K3y-abcdef&zone=DE", "K3y-abcdef"),
        ("https://x.test/v1?zone=DE&KEY=K3y-abcdef", "K3y-abcdef"),
        ("https://x.test/v1?zone=DE&token=K3y-abcdef", "K3y-abcdef"),
        ("headers {'auth-token': 'K3y-abcdef', 'accept': '*/*'}", "K3y-abcdef"),
        ("Authorization: Bearer K3y-abcdef", "K3y-abcdef"),
        ("{'Authorization': 'Basic dXNlcjpwYXNz'}", "dXNlcjpwYXNz"),
        ('{"token": "K3y-abcdef"}', "K3y-abcdef"),
        (f"postgresql+psycopg://gs:{DB_PASSWORD}@db.lab/gridshift", DB_PASSWORD),
    ],
)
def test_redact_hides_tokens_keys_headers_and_url_passwords(text, secret):
    shown = redact(text)
    assert secret not in shown and "***" in shown


def test_redact_leaves_ordinary_text_alone():
    for text in ("give KEY=VALUE", "monkey=banana", "job 3: completed", "sort key: name"):
        assert redact(text) == text


def test_printable_escapes_c0_del_c1_and_bidi_overrides():
    assert printable(NAME + LABEL) == ESCAPED_NAME + ESCAPED_LABEL
    assert printable("a\tb\nc\rd\x7f\x9b\u202e") == "a\\tb\\nc\\rd\\x7f\\x9b\\u202e"
    assert printable("ok → ünïcode") == "ok → ünïcode"
    # zero-width characters: "\u200bls" must not pass for "ls"
    hidden = "\u200b\u200c\u200d\u2060\ufeffzero"
    assert printable(hidden) == "\\u200b\\u200c\\u200d\\u2060\\ufeffzero"
    assert printable("数据 e\u0301") == "数据 e\u0301"  # wide and combining stay as they are


def test_printable_escapes_every_bidi_control_and_invisible_format_character():
    """A label or name reaching the terminal (``report``'s rows, ``ls``) cannot reorder
    what follows it (Unicode's Bidi_Control set, the Arabic letter mark too) nor hide in
    a word: ``l\u00ads`` must not pass for ``ls``."""
    bidi = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    invisible = "\u00ad\u180e\u2061\u2062\u2063\u2064\u206a\u206f"
    for char in bidi + invisible:
        code = ord(char)
        escaped = f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
        assert printable(f"a{char}b") == f"a{escaped}b", repr(char)


def test_log_filter_redacts_every_record_and_http_libraries_log_at_warning():
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(self.format(record))

    handler = guard(Keep())
    logger = logging.getLogger("orchestrator.test_hygiene")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("HTTP Request: GET %s", f"https://e.test/api?securityToken={TOKEN}&x=1")
        logger.warning("job %s named %s", 7, NAME)
        try:
            raise RuntimeError(f"cannot reach postgresql://gs:{DB_PASSWORD}@db/x")
        except RuntimeError:
            logger.exception("store failed")
    finally:
        logger.removeHandler(handler)
    text = "\n".join(records)
    assert TOKEN not in text and DB_PASSWORD not in text
    assert "securityToken=***" in text and "\x1b" not in text and ESCAPED_NAME in text
    assert "Traceback" in text  # the traceback stays, redacted
    for name in ("httpx", "httpcore"):
        assert logging.getLogger(name).getEffectiveLevel() >= logging.WARNING
    assert any(isinstance(f, LogHygiene) for f in handler.filters)


# -- the adapters' own errors ---------------------------------------------------------------


def _echo(status: int):
    def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, text=f"rejected {request.url} {dict(request.headers)}")

    return respond


@pytest.mark.parametrize(
    "spec,config,route",
    [
        ("entsoe:DE-LU", {"api_key": TOKEN}, "/api"),
        ("electricitymaps:DE", {"api_key": TOKEN}, "/carbon-intensity"),
        ("watttime:CAISO_NORTH", {"username": "lab", "password": TOKEN}, "/login"),
    ],
)
def test_provider_errors_quote_no_secret_even_when_the_provider_echoes_it(spec, config, route):
    router = Router().on(route, _echo(400)).on("/", _echo(400))
    name = spec.split(":")[0]
    source = build_source(
        spec,
        {name: ProviderConfig(base_url="https://p.test/api", **config)},
        router.client(),
        retries=0,
    )
    start = datetime(2023, 6, 1, tzinfo=UTC)
    with pytest.raises(GridDataError) as info:
        source.history(start, start + timedelta(hours=6))
    assert router.requests, "the provider was asked"
    message = str(info.value)
    assert TOKEN not in message and "HTTP 400" in message
    basic = httpx.BasicAuth("lab", TOKEN)._auth_header.split()[-1]
    assert basic not in message


# -- the real daemon and CLI against a local ENTSO-E look-alike ------------------------------


class _Entsoe(BaseHTTPRequestHandler):
    """Each test gets its own subclass (``fail``, ``seen``: the paths asked for)."""

    fail = False
    seen: ClassVar[list[str]] = []

    def do_GET(self):
        type(self).seen.append(self.path)
        query = parse_qs(urlparse(self.path).query)
        if type(self).fail:
            body, status = f"bad request {self.path} {dict(self.headers)}", 400
        else:
            body, status = _a44(query["periodStart"][0], query["periodEnd"][0]), 200
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # quiet
        pass


def _a44(start: str, end: str) -> str:
    a = datetime.strptime(start, "%Y%m%d%H%M").replace(tzinfo=UTC)
    b = datetime.strptime(end, "%Y%m%d%H%M").replace(tzinfo=UTC)
    hours = max(1, int((b - a).total_seconds() // 3600))
    points = "".join(
        f"<Point><position>{i + 1}</position><price.amount>{50 + i % 7}</price.amount></Point>"
        for i in range(hours)
    )
    return (
        '<Publication_MarketDocument xmlns="urn:iec62325.351:tc57wg16:451-3:'
        'publicationdocument:7:3"><TimeSeries><curveType>A01</curveType><Period>'
        f"<timeInterval><start>{a:%Y-%m-%dT%H:%MZ}</start><end>{b:%Y-%m-%dT%H:%MZ}</end>"
        f"</timeInterval><resolution>PT60M</resolution>{points}</Period></TimeSeries>"
        "</Publication_MarketDocument>"
    )


@pytest.fixture
def entsoe():
    handler = type("Handler", (_Entsoe,), {"fail": False, "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}/api"
    server.shutdown()
    server.server_close()


def _trace(path: Path) -> Path:
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    rows = ["time,carbon_g_per_kwh"]
    rows += [f"{(now + timedelta(hours=h)).isoformat()},{200 + h % 5}" for h in range(-48, 72)]
    path.write_text("\n".join(rows) + "\n")
    return path


def _scan(home: Path, outputs: list[str], secrets: tuple[str, ...]) -> None:
    """No secret in anything printed, nor in any file the runs left under the home."""
    for text in outputs:
        for secret in secrets:
            assert secret not in text, text
    for path in home.rglob("*"):
        if path.is_file() and path.name != "gridshift.toml":
            data = path.read_bytes()
            for secret in secrets:
                assert secret.encode() not in data, path


@pytest.mark.backends("sqlite")
def test_no_provider_token_in_the_daemons_log_or_any_output(cli, entsoe, tmp_path):
    handler, base_url = entsoe
    # in the config file, as a deployment keeps it (an environment variable would also be
    # in the environment each job stores, which is the submitter's to keep)
    config = cli.home / "gridshift.toml"
    config.write_text(f'[grid.entsoe]\napi_key = "{TOKEN}"\nbase_url = "{base_url}"\n')
    trace = str(_trace(tmp_path / "trace.csv"))
    outputs = []
    job = cli.submit("--now", "--name", NAME, "--label", LABEL, "--", "sh", "-c", "exit 3")
    proc = cli.run(
        "daemon", "--grid", f"csv:{trace}", "--price", "entsoe:DE-LU", "--objective",
        "mix:0.5", "--until-idle", "--interval", "0.1", timeout=120,
    )  # fmt: skip
    outputs += [proc.stdout, proc.stderr]
    assert any(f"securityToken={TOKEN}" in p for p in handler.seen), "the daemon asked"
    assert "\x1b" not in proc.stderr  # the log quotes no raw escape either
    assert cli.json("show", str(job))["state"] == "failed"
    for args in (
        ["grid", "show", "--source", "entsoe:DE-LU"],
        ["grid", "fetch", "--source", "entsoe:FR"],
        ["grid", "sources"],
        ["plan", "--grid", f"csv:{trace}", "--price", "entsoe:DE-LU", "--objective", "cost"],
        ["status"],
    ):
        proc = cli.run(*args, timeout=120)
        outputs += [proc.stdout, proc.stderr]
    # a provider that answers with an error quoting the whole request
    handler.fail = True
    seen = len(handler.seen)
    proc = cli.run("grid", "show", "--source", "entsoe:NL", check=False, timeout=120)
    assert proc.returncode != 0 and "HTTP 400" in proc.stderr, proc.stderr
    outputs += [proc.stdout, proc.stderr]
    cli.submit("--now", "--", "true")
    proc = cli.run(
        "daemon", "--grid", f"csv:{trace}", "--price", "entsoe:BE", "--until-idle",
        "--interval", "0.1", timeout=120,
    )  # fmt: skip
    outputs += [proc.stdout, proc.stderr]
    assert len(handler.seen) > seen, "the failing provider was asked"
    proc = cli.run("status")
    outputs += [proc.stdout, proc.stderr]
    _scan(cli.home, outputs, (TOKEN,))


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://gs:{pw}@127.0.0.1:{port}/gridshift",  # cannot connect
        "mysql+pymysql://gs:{pw}@127.0.0.1:{port}/gridshift",  # no driver installed
        "postgresql+psycopg//gs:{pw}@127.0.0.1:{port}/gridshift",  # cannot be parsed
    ],
    ids=["unreachable", "no-driver", "malformed"],
)
def test_no_database_password_in_any_error(cli, url):
    cli.env["GRIDSHIFT_DATABASE_URL"] = url.format(pw=DB_PASSWORD, port=free_port())
    outputs = []
    for args in (["ls"], ["status"], ["submit", "--", "true"], ["daemon", "--until-idle"]):
        proc = cli.run(*args, check=False, timeout=60)
        assert proc.returncode != 0, proc
        assert proc.stderr.startswith("gridshift: error:") and "***" in proc.stderr, proc.stderr
        outputs += [proc.stdout, proc.stderr]
    _scan(cli.home, outputs, (DB_PASSWORD,))


# -- metrics ----------------------------------------------------------------------------------


def _listening(port: int) -> set[str]:
    """The local addresses a TCP socket listens on ``port`` at (from /proc/net/tcp*)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                found.add(addr)
    return found


@pytest.mark.backends("sqlite")
def test_metrics_listen_on_loopback_unless_told_otherwise(cli):
    pytest.importorskip("prometheus_client")
    if not Path("/proc/net/tcp").exists():
        pytest.skip("needs /proc/net/tcp to see the bound address")
    port = free_port()
    cli.daemon("--metrics-port", str(port))
    wait_for(lambda: _listening(port), 60, "the metrics endpoint")
    assert _listening(port) == {"0100007F"}  # 127.0.0.1, in /proc's byte order
    assert "gridshift_queue_length" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
    proc = cli.run("daemon", "--metrics-port", "9", "--metrics-addr", "everywhere", check=False)
    assert proc.returncode == 2 and "--metrics-addr" in proc.stderr, proc.stderr


# -- control characters ----------------------------------------------------------------------


@pytest.mark.backends("sqlite")
def test_names_labels_and_commands_print_escaped_and_exact_in_json(cli):
    job = cli.submit("--name", NAME, "--label", LABEL, "--", "echo", LABEL, "[link=x]y[/link]")
    cli.run("submit", "--name", NAME, "--cron", "0 2 * * *", "--window", "8h", "--", "echo", NAME)
    markup = cli.submit("--name", "[/]", "--", "true")  # shown, not obeyed (nor a crash)
    for args in (["ls"], ["ls", "--all"], ["show", str(job)], ["cron", "ls"]):
        out = cli.run(*args).stdout
        assert "\x1b" not in out and "\x07" not in out, (args, out)
        assert ESCAPED_NAME in out, (args, out)
    assert ESCAPED_NAME in cli.run("show", str(job)).stdout
    assert ESCAPED_LABEL in cli.run("show", str(job)).stdout
    assert "[link=x]y[/link]" in cli.run("show", str(job)).stdout
    assert "[/]" in cli.run("show", str(markup)).stdout
    data = cli.json("show", str(job))
    assert data["name"] == NAME and data["labels"] == [LABEL]
    assert data["command"] == ["echo", LABEL, "[link=x]y[/link]"]
    assert [j["name"] for j in cli.json("ls")][:1] == [NAME]
    assert json.loads(cli.run("cron", "ls", "--json").stdout)[0]["command"] == ["echo", NAME]


# -- the systemd unit -------------------------------------------------------------------------


def test_systemd_unit_runs_the_daemon_with_its_home_socket_dir_and_restart(tmp_path):
    import configparser
    import shutil
    import subprocess
    import sys

    from tests.conftest import ROOT

    text = (ROOT / "configs" / "gridshift.service").read_text()
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # systemd's keys are case-sensitive
    unit.read_string(text)
    service = unit["Service"]
    assert service["ExecStart"].endswith("gridshift daemon")
    assert service["Restart"] == "on-failure"
    assert service["RuntimeDirectory"] == "gridshift"
    assert service["Environment"] == "GRIDSHIFT_HOME=/var/lib/gridshift"
    assert "/run/gridshift/gridshift.sock" in text and "socket" in text
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        return
    gridshift = Path(sys.executable).with_name("gridshift")
    if not gridshift.exists():
        return
    copy = tmp_path / "gridshift.service"
    copy.write_text(text.replace("/usr/local/bin/gridshift", str(gridshift)))
    proc = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
