"""``gridshift grid`` end to end: the real CLI, real files, and a real local HTTP server
standing in for a provider through its base-URL setting."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from tests.conftest import shared_data
from tests.grid_fixtures import uk_rows

DATA = shared_data() / "grid"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="shared grid data is absent")
SECRET = "supersecret-token-4711"
# ``gridshift grid`` never opens the queue's store: one backend is enough
pytestmark = pytest.mark.backends("sqlite")


class FakeProvider(BaseHTTPRequestHandler):
    status = 200
    seen: ClassVar[list[str]] = []

    def do_GET(self):
        FakeProvider.seen.append(self.path)
        if FakeProvider.status != 200:
            self.send_response(FakeProvider.status)
            self.end_headers()
            return
        body = json.dumps({"data": uk_rows(0, 4)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def provider() -> Iterator[str]:
    FakeProvider.status, FakeProvider.seen = 200, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeProvider)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@needs_data
def test_done_when_de_lu_2023(cli):
    path = DATA / "carbon" / "DE-LU" / "DE-LU_2023_hourly.csv"
    out = cli.json("grid", "show", "--source", f"csv:{path}")
    assert out["points"] == 8760 and out["mean"] == 367.0
    assert list(out) == [
        "source",
        "zone",
        "kind",
        "unit",
        "start",
        "end",
        "resolution_s",
        "points",
        "filled",
        "mean",
        "min",
        "max",
    ]


def test_show_series_and_human_summary(cli, tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("time,ci\n" + "".join(f"2024-01-01T{h:02d}:00Z,{100 + h}\n" for h in range(12)))
    out = cli.json(
        "grid",
        "show",
        "-s",
        f"csv:{path}",
        "--series",
        "--start",
        "2024-01-01T02:00",
        "--end",
        "2024-01-01T05:00",
    )
    assert out["series"] == [
        ["2024-01-01T02:00:00+00:00", 102.0],
        ["2024-01-01T03:00:00+00:00", 103.0],
        ["2024-01-01T04:00:00+00:00", 104.0],
    ]
    text = cli.run("grid", "show", "-s", f"csv:{path}", "--window", "2h").stdout
    assert "greenest 2h: 2024-01-01 00:00 UTC" in text and "mean 100.5" in text
    assert any(ch in text for ch in "▁▂▃▄▅▆▇█")


def test_fetch_caches_and_an_outage_falls_back_with_its_age(cli, provider):
    cli.env["GRIDSHIFT_GRID__UK__BASE_URL"] = provider
    cli.env["GRIDSHIFT_GRID__RETRIES"] = "0"
    rng = ["--start", "2023-06-01T00:00Z", "--end", "2023-06-01T02:00Z"]
    out = cli.run("grid", "fetch", "--source", "uk", *rng).stdout
    assert out.startswith("4 points from uk") and len(FakeProvider.seen) == 1
    assert FakeProvider.seen[0] == "/intensity/2023-06-01T00:01Z/2023-06-01T02:00Z"
    assert cli.json("grid", "show", "-s", "uk", *rng)["points"] == 4
    assert len(FakeProvider.seen) == 1, "the same range is fetched once"
    FakeProvider.status = 503
    assert cli.json("grid", "show", "-s", "uk", "--start", "2023-06-01T00:30Z",
                    "--end", "2023-06-01T01:30Z")["points"] == 2  # fmt: skip
    assert len(FakeProvider.seen) == 1, "nor is a part of it"
    text = cli.run(  # more than was fetched: the outage is served what the cache holds
        "grid", "show", "-s", "uk", "--start", "2023-06-01T00:00Z", "--end", "2023-06-01T03:00Z"
    ).stdout
    assert "served from the cache" in text and "HTTP 503" in text and "4 points" in text


def test_keys_never_appear_in_output(cli, provider):
    cli.env["GRIDSHIFT_GRID__ENTSOE__API_KEY"] = SECRET
    cli.env["GRIDSHIFT_GRID__ENTSOE__BASE_URL"] = provider
    cli.env["GRIDSHIFT_GRID__RETRIES"] = "0"
    FakeProvider.status = 400
    proc = cli.run(
        "grid",
        "show",
        "-s",
        "entsoe:DE-LU",
        "--start",
        "2023-06-01",
        "--end",
        "2023-06-02",
        check=False,
    )
    assert proc.returncode == 1 and "HTTP 400" in proc.stderr
    assert SECRET not in proc.stdout + proc.stderr
    assert any(SECRET in path for path in FakeProvider.seen), "the token was sent"
    sources = cli.json("grid", "sources")
    entsoe = next(s for s in sources if s["name"] == "entsoe")
    assert entsoe["ready"] is True and SECRET not in json.dumps(sources)
    assert next(s for s in sources if s["name"] == "watttime")["ready"] is False


def test_a_refused_key_is_a_failure_of_the_provider_in_one_line(cli, provider):
    """Exit 1, not 2: the key was accepted until the provider stopped accepting it
    (expired, revoked) as often as it was mistyped, and the daemon treats it as that
    source's failure too (the next source, then the cache)."""
    cli.env["GRIDSHIFT_GRID__ELECTRICITYMAPS__API_KEY"] = SECRET
    cli.env["GRIDSHIFT_GRID__ELECTRICITYMAPS__BASE_URL"] = provider
    FakeProvider.status = 401
    rng = ["--start", "2023-06-01", "--end", "2023-06-02"]
    proc = cli.run("grid", "show", "-s", "electricitymaps:DE", *rng, check=False)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused the credentials (HTTP 401)" in lines[0], lines
    assert "check the key" in lines[0] and SECRET not in proc.stdout + proc.stderr
    assert len(FakeProvider.seen) == 1, "a refused key is not retried"


@pytest.mark.parametrize(
    "args,message",
    [
        (["-s", "nosuch:DE"], "unknown grid source"),
        (["-s", "csv:/no/such.csv"], "no such file"),
        (["-s", "electricitymaps:DE"], "API key is not set"),
        (["-s", "watttime"], "give a zone or region"),
        (["-s", "uk", "--start", "2023-06-02", "--end", "2023-06-01"], "before --end"),
        (["-s", "uk", "--start", "yesterday"], "invalid time"),
        ([], "no grid source"),
    ],
)
def test_bad_grid_input_exits_2(cli, args, message):
    proc = cli.run("grid", "show", *args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr


def test_csv_without_numbers_exits_2(cli, tmp_path):
    path = tmp_path / "words.csv"
    path.write_text("time,word\n2024-01-01,a\n2024-01-02,b\n")
    proc = cli.run("grid", "show", "-s", f"csv:{path}", check=False)
    assert proc.returncode == 2 and "no numeric column" in proc.stderr


def test_a_range_outside_the_trace_is_one_clear_line(cli, tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("time,ci\n2024-01-01T00:00Z,1\n2024-01-01T01:00Z,2\n")
    proc = cli.run("grid", "show", "-s", f"csv:{path}", "--start", "2030-01-01", check=False)
    assert proc.returncode == 2 and "no data from" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
