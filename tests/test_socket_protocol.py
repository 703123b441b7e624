"""The daemon's socket, in-process: the protocol's error answers (oversize, garbage,
another version, an unknown op, a client that sends nothing) each leave the server
serving; the socket file is made safely; the thin client loads no heavy library."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.api import client, protocol
from orchestrator.daemon.ops.base import OpContext
from orchestrator.daemon.server import SocketServer
from orchestrator.errors import DaemonError
from orchestrator.queue.db import Database
from orchestrator.settings import Settings
from tests.conftest import ROOT


@pytest.fixture
def server(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    settings = Settings(home=home, fake_gpus=2)
    db = Database(settings.db_url)
    db.ensure_schema()
    ctx = OpContext(settings, open_db=lambda: db, daemon_running=lambda: True)
    srv = SocketServer(ctx, timeout_s=1.0, max_request=1 << 16).start()
    yield srv
    srv.stop()
    db.dispose()


def _raw(path: str, payload: bytes, *, shut: bool = True) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        try:
            sock.sendall(payload)
            if shut:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # answered and closed before reading it all
        return json.loads(protocol.read_line(sock, 1 << 30, None))


def _alive(srv: SocketServer) -> None:
    assert client.request(srv.path, "ls", {}) == {"jobs": [], "hidden": 0}


@pytest.mark.parametrize(
    "payload,kind,message",
    [
        (b"x" * (1 << 17), "TooLarge", "larger than"),
        (b"\x00\xffnot json at all\n", "ProtocolError", "malformed request"),
        (b"[1, 2, 3]\n", "ProtocolError", "malformed request"),
        (b'{"v": 2, "op": "ls", "args": {}}\n', "ProtocolError", "protocol version 2"),
        (b'{"v": 1, "op": "rm -rf", "args": {}}\n', "ProtocolError", "unknown request"),
        (b'{"v": 1, "op": "show", "args": {"job_id": "1; drop"}}\n', "ProtocolError", "type"),
        (b'{"v": 1, "op": "show", "args": {"job_id": 7}}\n', "NotFoundError", "no job 7"),
    ],
    ids=["oversize", "garbage", "not-an-object", "version", "unknown-op", "bad-arg", "no-job"],
)
def test_a_bad_request_gets_one_error_answer_and_the_server_lives_on(
    server, payload, kind, message
):
    answer = _raw(server.path, payload)
    assert answer["v"] == 1 and answer["ok"] is False
    assert answer["error"]["kind"] == kind and message in answer["error"]["message"]
    assert answer["error"]["exit_code"] in (1, 2)
    _alive(server)


def test_requests_that_break_the_parser_give_back_their_slots(server):
    """Nesting too deep for the JSON parser (RecursionError) and JSON's non-numbers are
    malformed requests; more of them than the server has slots leave it serving."""
    deep = b'{"v": 1, "op": "ls", "args": ' + b"[" * 30000 + b"]" * 30000 + b"}\n"
    for _ in range(server.max_slots + 8):
        answer = _raw(server.path, deep)
        assert answer["error"]["kind"] == "ProtocolError", answer
    for constant in (b"Infinity", b"NaN", b"-Infinity"):
        line = b'{"v": 1, "op": "submit", "args": {"jobs": [{"duration": ' + constant + b"}]}}\n"
        assert "malformed request" in _raw(server.path, line)["error"]["message"]
    _alive(server)


def test_a_client_that_sends_nothing_times_out_and_stalls_no_one(server):
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    idle.connect(server.path)
    started = time.monotonic()
    _alive(server)  # answered while the idle one waits
    assert time.monotonic() - started < 0.9
    idle.settimeout(10)
    answer = json.loads(protocol.read_line(idle, 1 << 20, None))
    assert "no whole request within" in answer["error"]["message"]
    idle.close()
    _alive(server)


def test_fifty_concurrent_clients_are_all_answered(server):
    results: list = []

    def one() -> None:
        results.append(client.request(server.path, "ls", {"all": True}))

    threads = [threading.Thread(target=one) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == [{"jobs": [], "hidden": 0}] * 50


def test_client_errors_come_back_as_gridshift_errors(server):
    from orchestrator.errors import NotFoundError

    with pytest.raises(NotFoundError, match="no job 3"):
        client.request(server.path, "logs", {"job_id": 3})
    with pytest.raises(client.NoDaemon, match="no gridshift daemon serves"):
        client.request(server.path + ".missing", "ls", {})


def test_the_socket_is_private_and_replaces_only_a_stale_socket_of_its_own(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    settings = Settings(home=home)
    ctx = OpContext(settings, open_db=lambda: None, daemon_running=lambda: True)
    path = settings.socket_path
    # a stale socket of this user: replaced
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    srv = SocketServer(ctx).start()
    assert stat.S_IMODE(path.lstat().st_mode) == 0o600 and stat.S_ISSOCK(path.lstat().st_mode)
    # a live one: a second server refuses
    with pytest.raises(DaemonError, match="another gridshift daemon serves"):
        SocketServer(ctx).start()
    srv.stop()
    assert not path.exists(), "the daemon removes its socket when it stops"
    # a symlink or a plain file there: refused, left as it was
    target = tmp_path / "precious"
    target.write_text("keep")
    path.symlink_to(target)
    with pytest.raises(DaemonError, match="not a socket of this daemon's user"):
        SocketServer(ctx).start()
    assert path.is_symlink() and target.read_text() == "keep"
    path.unlink()
    path.write_text("a file")
    with pytest.raises(DaemonError, match="not a socket"):
        SocketServer(ctx).start()
    assert path.read_text() == "a file"
    # a directory others may write: refused
    path.unlink()
    os.chmod(home, 0o777)
    with pytest.raises(DaemonError, match="can write there"):
        SocketServer(ctx).start()


def test_the_thin_client_loads_only_the_standard_library():
    code = (
        "import sys; import orchestrator.api.client, orchestrator.api.protocol; "
        "print(sorted(m for m in ('pydantic', 'pydantic_settings', 'sqlmodel', 'sqlalchemy', "
        "'rich', 'typer', 'orchestrator.settings', 'orchestrator.queue') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.strip() == "[]"


def test_locate_follows_the_settings_precedence(tmp_path, monkeypatch):
    home = tmp_path / "h"
    home.mkdir()
    for name in ("GRIDSHIFT_SOCKET", "GRIDSHIFT_SHARED_GROUP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GRIDSHIFT_HOME", str(home))
    assert client.locate(None) == client.Address(str(home / "gridshift.sock"), False)
    (home / "gridshift.toml").write_text('shared_group = "lab"\nsocket = "/run/gs/gs.sock"\n')
    assert client.locate(None) == client.Address("/run/gs/gs.sock", True)
    monkeypatch.setenv("GRIDSHIFT_SOCKET", str(tmp_path / "s.sock"))
    assert client.locate(None).socket == str(tmp_path / "s.sock")
    assert Settings(home=home, socket=tmp_path / "s.sock").socket_path == tmp_path / "s.sock"
    (home / "gridshift.toml").write_text("socket = [oops\n")
    assert client.locate(None) is None, "the full loader reports a broken file"
