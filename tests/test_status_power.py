"""Right-sizing's servers in ``status`` and in a new job's outlook: a server powered off,
waking or whose wake failed says so (not "unreachable"); a job that fits only on a server
that is off says it waits for that server to wake (about its configured ``wake``), or for
the retry of a wake that failed. Power commands' words are escaped and cut."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.helpers.rightsize import _sizer

NOW = datetime(2026, 11, 24, 19, 30, tzinfo=UTC)
HOSTILE = "power_on: ipmi: exit 1: \x1b[2J\x1b]0;owned\x07[red]boom[/]\nline two" + "Z" * 5000


def _iso(delta_s: float) -> str:
    return (NOW + timedelta(seconds=delta_s)).isoformat()


@pytest.fixture(autouse=True)
def _utc(monkeypatch):
    monkeypatch.setenv("GRIDSHIFT_UTC", "1")


def _lines(unreachable, power) -> list[str]:
    from rich.text import Text

    from orchestrator.cli.output.nodepower import node_lines

    return [Text.from_markup(line).plain for line in node_lines(unreachable, power, NOW)]


def test_status_says_a_server_is_off_or_waking_not_unreachable():
    power = {
        "gpu1": {"power_state": "off", "since": _iso(-600), "error": None, "retry_at": None},
        "gpu2": {"power_state": "waking", "since": _iso(-30), "error": None, "retry_at": None},
        "gpu3": {"power_state": "on", "since": _iso(-9), "error": None, "retry_at": None},
        "gpu4": {"power_state": "on", "since": None, "error": None, "retry_at": None},
    }
    unreachable = {"gpu1": _iso(-590), "gpu2": _iso(-20), "gpu3": _iso(-5)}
    lines = _lines(unreachable, power)
    assert lines == [
        "node       gpu1 off since 2026-11-24 19:20 UTC (powered down by right-sizing "
        "while idle; woken for a job)",
        "node       gpu2 waking since 2026-11-24 19:29 UTC (right-sizing woke it for a job)",
        # on as right-sizing knows it, and not answering: that is unreachable
        "node       gpu3 unreachable since 2026-11-24 19:29 UTC",
    ]


def test_status_json_lists_as_unreachable_only_servers_that_are_on():
    """``nodes_unreachable`` agrees with the text: a server right-sizing has off, powering
    off, waking or wake failed is in ``nodes_power`` alone."""
    from orchestrator.daemon.health import unreachable

    down = {f"gpu{i}": NOW.timestamp() - i for i in range(1, 7)}
    power = {
        "gpu1": {"power_state": "off"},
        "gpu2": {"power_state": "waking"},
        "gpu3": {"power_state": "wake failed"},
        "gpu4": {"power_state": "powering off"},
        "gpu5": {"power_state": "on"},
    }  # gpu6: not managed by right-sizing
    assert unreachable(down, power) == {"gpu5": _iso(-5), "gpu6": _iso(-6)}
    assert unreachable(down, {}) == {n: _iso(-int(n[3:])) for n in down}
    assert unreachable({}, power) == {}


def test_a_failed_wake_says_its_error_escaped_and_cut_and_when_it_is_tried_again():
    failed = {"power_state": "wake failed", "since": _iso(-60), "error": HOSTILE,
              "retry_at": _iso(90)}  # fmt: skip
    (line,) = _lines({"gpu1": _iso(-50)}, {"gpu1": failed})
    assert line.startswith("node       gpu1 wake failed since 2026-11-24 19:29 UTC: "
                           "power_on: ipmi: exit 1: \\x1b[2J\\x1b]0;owned\\x07[red]boom[/]"
                           "\\x0aline two")  # fmt: skip
    assert line.endswith("ZZZ; tried again at 2026-11-24 19:31 UTC"), line
    assert "unreachable" not in line and len(line) < 330 and line.isprintable(), line
    (line,) = _lines({}, {"gpu1": failed | {"retry_at": _iso(-1)}})  # its retry is due
    assert line.endswith("; tried again when a job next needs it"), line
    (line,) = _lines({}, {"gpu1": failed | {"error": None, "retry_at": "not a time"}})
    assert line.endswith("wake failed since 2026-11-24 19:29 UTC: no reason given; tried "
                         "again when a job next needs it")  # fmt: skip
    (line,) = _lines({}, {"gpu1": failed | {"retry_at": "2026-11-24T19:40:00"}})  # no zone
    assert line.endswith("; tried again when a job next needs it"), line


def test_a_hostile_server_name_or_state_is_shown_not_obeyed():
    odd = {"power_state": "[blink]x\x1b[5m", "since": None}
    (line,) = _lines({"[bold]n\x1b": _iso(0)}, {"[bold]n\x1b": odd})
    assert line == "node       [bold]n\\x1b [blink]x\\x1b[5m", line


def test_the_daemon_records_each_servers_power_for_status(tmp_path):
    """``Levers.power_view``, the health's ``nodes_power``: a failure read back from a row
    (a restarted daemon's) is escaped and cut as a fresh one is."""
    from orchestrator.daemon.energy.levers import Levers

    sizer, _alloc, _db = _sizer(tmp_path, ["/bin/true"], ["/bin/true"])
    levers = Levers(sizer, idle=None)
    a = sizer.nodes["a"]
    assert levers.power_view() == {
        "a": {"power_state": "on", "since": None, "error": None, "retry_at": None}
    }
    a.state, a.since_s, a.error, a.retry_at_s = "wake failed", NOW.timestamp(), HOSTILE, 1e9
    seen = levers.power_view()["a"]
    assert seen["since"] == "2026-11-24T19:30:00+00:00" and seen["retry_at"] is not None
    assert seen["error"].startswith("power_on: ipmi: exit 1: \\x1b[2J\\x1b]0;owned")
    assert len(seen["error"]) == 200 and seen["error"].isprintable()
    assert Levers(None, idle=None).power_view() == {}


def _server(name, state="on", gpus=2, free=2, **extra):
    from orchestrator.daemon.ops.wakeoutlook import Server

    return Server(name, state, gpus, free, **extra)


def test_a_job_that_fits_only_on_a_server_off_waits_for_its_wake():
    from orchestrator.daemon.ops.wakeoutlook import wake_wait

    busy = _server("here", free=0)
    off = _server("gpu1", "off", gpus=4, free=4, wake_s=120.0)
    assert wake_wait(1, None, [_server("here"), off], NOW) is None, "it fits on one on"
    got = wake_wait(2, None, [busy, off], NOW)
    assert got == {"nodes": ["gpu1"], "power_state": "off", "wake_s": 120.0,
                   "names": "gpu1", "span": " (about 2m)"}  # fmt: skip
    assert wake_wait(8, None, [busy, off], NOW) is None, "wider than any one: no word"
    assert wake_wait(2, None, [busy, _server("b", free=1)], NOW) is None, "waits for GPUs"
    typed = _server("v", "off", gpus=4, free=4, gpu_type="v100", wake_s=60.0)
    assert wake_wait(2, "a100", [_server("h", free=2, gpu_type="v100"), typed], NOW) is None
    assert wake_wait(1, "v100", [_server("h", gpu_type="a100"), typed], NOW)["nodes"] == ["v"]
    waking = _server("gpu2", "waking", since=NOW - timedelta(seconds=90), wake_s=300.0)
    got = wake_wait(2, None, [busy, off, waking], NOW)
    assert got["nodes"] == ["gpu2"] and got["wake_s"] == 210.0 and got["span"] == " (about 3m30s)"
    late = _server("gpu2", "waking", since=NOW - timedelta(hours=1), wake_s=300.0)
    assert wake_wait(2, None, [busy, late], NOW)["span"] == "", "no estimate past its wake"
    other = _server("gpu3", "off", wake_s=600.0)
    assert wake_wait(2, None, [busy, off, other], NOW)["span"] == " (about 2m to 10m)"


def test_a_job_whose_every_fitting_server_failed_to_wake_says_so():
    from orchestrator.daemon.ops.wakeoutlook import wake_wait

    failed = _server("gpu1", "wake failed", error=HOSTILE, wake_s=60.0)
    small = _server("here", gpus=1, free=1)  # on, too small for it
    got = wake_wait(2, None, [small, failed], NOW)
    assert got["nodes"] == ["gpu1"] and got["power_state"] == "wake failed"
    words = got["failed"]
    assert words.startswith("gpu1, whose wake failed (gpu1: power_on: ipmi: exit 1: \\x1b[2J")
    assert words.endswith("ZZ); the daemon tries again after a back-off (1m doubling up to "
                          "30m): gridshift status says when")  # fmt: skip
    assert words.isprintable() and len(words) < 330
    off = _server("gpu2", "off", wake_s=60.0)  # one that may be woken: that one
    assert wake_wait(2, None, [small, failed, off], NOW)["nodes"] == ["gpu2"]
    # one that is on and fits, busy now: the job starts there once its GPUs free (the
    # failed server is barred until its retry), so it waits for GPUs, not for that wake
    assert wake_wait(2, None, [_server("here", free=1), failed], NOW) is None


@pytest.mark.parametrize("defers", [False, True])
def test_the_outlook_in_words(defers):
    from orchestrator.daemon.ops.outlook import _waking

    when = "may wait until T for low carbon" if defers else "starts now"
    wake = {"names": "gpu1", "span": " (about 2m)"}
    said = _waking(when, wake, defers)
    assert said == (
        "may wait until T for low carbon; right-sizing wakes gpu1 for it (about 2m)"
        if defers
        else "starts once gpu1 wakes (about 2m)"
    )
    said = _waking(when, {"failed": "gpu1, whose wake failed (x)"}, defers)
    assert said.endswith("waits for gpu1, whose wake failed (x)")


def test_the_outlook_reads_the_servers_power_from_the_store(tmp_path):
    """``wakeoutlook.servers``: a managed server's state, since when and failure from its
    row, its configured wake; one not managed is on."""
    from types import SimpleNamespace as NS

    from orchestrator.daemon.ops.wakeoutlook import servers, wake_wait
    from orchestrator.queue.models import Node

    sizer, _alloc, db = _sizer(
        tmp_path, ["/bin/true"], ["/bin/true"], wake="90s", wake_timeout="2m"
    )
    with db.write() as session:
        for name in ("a", "b"):  # b's row says off too: b is not managed, so it is on
            row = session.get(Node, name)
            row.power_state, row.power_error = "wake failed", HOSTILE
            row.power_since = NOW
            session.add(row)
    settings = NS(nodes=[sizer.nodes["a"].cfg, NS(name="b", power_off=None, power_on=None)])
    with db.read() as session:
        a, b = servers(session, settings)
        assert servers(session, NS(nodes=settings.nodes[1:])) == [], "nothing managed"
    assert (a.name, a.state, a.gpus, a.free, a.wake_s, a.since) == (
        "a",
        "wake failed",
        2,
        2,
        90.0,
        NOW,
    )
    assert a.error == HOSTILE and (b.state, b.error, b.wake_s) == ("on", None, None)
    assert wake_wait(2, None, [a, b], NOW) is None, "b is on and free: it starts there"


def test_a_cpu_only_job_never_waits_for_a_wake():
    """A job of no GPUs is placed on the first node with no GPUs and never wakes a server
    (``RunningViews.allocate``): its outlook says nothing of a wake, even where every
    server is off."""
    from orchestrator.daemon.ops.wakeoutlook import wake_wait

    off = _server("gpu1", "off", gpus=4, free=4, wake_s=120.0)
    failed = _server("gpu2", "wake failed", error="boom", wake_s=60.0)
    assert wake_wait(0, None, [off], NOW) is None
    assert wake_wait(0, None, [failed], NOW) is None
