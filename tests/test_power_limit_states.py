"""The site power limit's review (session 10): what a restarted daemon finds (a wake or
power_off under way, a server stored off that answers), an off server asked now and
then, a server off at start counted by the GPU ranges discovery stored, an unreachable
server powering off, the start-up wake check independent of which servers are on, and
``refused`` kept to jobs that wait. Servers are stand-ins (``tests.test_power_limit``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from tests.helpers.rightsize import _sizer

pytestmark = pytest.mark.backends("sqlite")


def _until(cond, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.fixture
def fast(monkeypatch):
    from orchestrator.daemon.energy import rightsizing

    monkeypatch.setattr(rightsizing, "PROBE_EVERY_S", 0.02)


def test_a_restarted_daemon_waits_for_a_wake_left_under_way_counting_it_highest(tmp_path, fast):
    up = []
    probe = lambda _n: None if up else "ssh: connection refused"  # noqa: E731
    sizer, _, _ = _sizer(tmp_path, ["/bin/true"], ["/bin/true"], probe=probe)
    now = time.time()
    sizer.restore(now, {"a": {"power_state": "waking", "power_since": datetime.now(UTC)}})
    time.sleep(0.2)  # booting: no answer yet, several times
    sizer.step(None, [], now + 1)
    assert sizer.nodes["a"].state == "waking" and sizer.counted("a") == "may be on"
    up.append(True)  # the boot the previous daemon started ends: it answers
    _until(lambda: not sizer.nodes["a"].busy)
    sizer.step(None, [], now + 2)
    assert sizer.nodes["a"].state == "on" and sizer.counted("a") == "on"


def test_a_restored_wake_not_answered_by_its_timeout_failed_and_stays_counted(tmp_path, fast):
    sizer, _, _ = _sizer(tmp_path, ["/bin/true"], ["/bin/true"], probe=lambda _n: "refused")
    then = datetime.fromtimestamp(time.time() - 3600, UTC)
    sizer.restore(time.time(), {"a": {"power_state": "waking", "power_since": then}})
    _until(lambda: not sizer.nodes["a"].busy)
    sizer.step(None, [], time.time())
    assert sizer.nodes["a"].state == "wake failed" and sizer.counted("a") == "may be on"


def test_a_restored_power_off_is_off_once_it_stops_answering_else_on(tmp_path, fast):
    answers = [None, None, "refused", "refused", "refused"]
    probe = lambda _n: answers.pop(0) if answers else "refused"  # noqa: E731
    sizer, _, _ = _sizer(tmp_path, ["/bin/true"], ["/bin/true"], probe=probe)
    since = datetime.now(UTC)
    sizer.restore(time.time(), {"a": {"power_state": "powering off", "power_since": since}})
    assert sizer.counted("a") == "powering off"
    _until(lambda: not sizer.nodes["a"].busy)
    sizer.step(None, [], time.time())
    assert sizer.nodes["a"].state == "off" and sizer.counted("a") == "off"


def test_a_server_off_is_asked_every_recheck_and_is_on_once_it_answers(tmp_path, fast):
    from orchestrator.daemon.energy.rightsizing import RECHECK_S

    up = []
    probe = lambda _n: None if up else "refused"  # noqa: E731
    sizer, _, _ = _sizer(tmp_path, ["/bin/true"], ["/bin/true"], probe=probe)
    t0 = time.time()
    sizer.restore(t0, {"a": {"power_state": "off"}})
    up.append(True)  # powered on by hand (a BMC's power restore, someone at the console)
    sizer.step(None, [], t0 + 1)
    _until(lambda: not sizer.nodes["a"].busy)
    sizer.step(None, [], t0 + 2)
    assert sizer.nodes["a"].state == "off", "asked only every RECHECK_S"
    sizer.step(None, [], t0 + RECHECK_S + 1)  # asked (a thread): counted off meanwhile
    assert sizer.counted("a") == "off"
    _until(lambda: not sizer.nodes["a"].busy)
    sizer.step(None, [], t0 + RECHECK_S + 2)
    assert sizer.nodes["a"].state == "on" and sizer.counted("a") == "on"
