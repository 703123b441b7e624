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


# -- the site limit's count ---------------------------------------------------------------
def _site(*args, **kw):
    from tests.test_power_limit_rightsize import _site

    return _site(*args, **kw)


def test_a_server_stored_off_whose_gpus_answer_is_on_counted_and_parked(tmp_path):
    from tests.test_power_limit_rightsize import _running

    site, s, states = _site(800.0, {"B": "on"})  # it answers: GPUs at their 300 W default
    site._stored_power = lambda: {"B": "off"}  # a daemon left it off (a BMC restored power)
    states["B"] = "off"

    site.check()
    assert site.answered == {"B"}  # right-sizing restores it on (``answering``)
    states.pop("B")  # as RightSizer.restore says it: on
    site._holding = lambda: [_running(site, "A")]
    site.rebalance()
    real = sum(s["A"].lim.values()) + sum(s["B"].lim.values())
    assert real <= 800.0 and s["B"].lim == {0: 100.0, 1: 100.0}
    assert site.in_force_w() == real


def test_restore_takes_a_server_stored_off_that_answered_the_site_limit_as_on(tmp_path):
    sizer, _, _ = _sizer(tmp_path, ["/bin/true"], ["/bin/true"])
    sizer.answering = lambda: {"a"}
    sizer.restore(time.time(), {"a": {"power_state": "off"}})
    assert sizer.nodes["a"].state == "on" and sizer.nodes["a"].idle_since_s is not None


def _h100_site(limit_w: float, ranges: dict):
    from executors.gpu.base import GpuInfo
    from orchestrator.daemon.energy.sitelimit import SiteLimit
    from orchestrator.nodes.inventory import ResolvedNode
    from orchestrator.nodes.powercaps import ClusterCaps, PowerCaps
    from orchestrator.settings.nodes import NodeConfig
    from tests.test_power_limit import _Server

    a, b = _Server(), _Server(700.0)
    b.down = True  # off
    cfg = NodeConfig(name="B", executor="ssh", host="h", gpus=2, idle_off_after="1m",
                     power_off=["/bin/true"], power_on=["/bin/true"])  # fmt: skip
    gpus = lambda m: tuple(GpuInfo(i, f"{m}{i}", m) for i in (0, 1))  # noqa: E731
    h100 = gpus("NVIDIA H100 80GB HBM3")
    nodes = [ResolvedNode("A", "ssh", gpus("NVIDIA A40"), "config"),
             ResolvedNode("B", "ssh", h100, "config", config=cfg)]  # fmt: skip
    site = SiteLimit(limit_w, ClusterCaps({"A": PowerCaps(a, 2), "B": PowerCaps(b, 2)}),
                     nodes, db=None)  # fmt: skip
    site._stored_power = lambda: {"B": "off"}
    site._stored_ranges = lambda: ranges
    site.power = lambda n: "off" if n == "B" else "on"
    site._model = lambda _n: None
    site._holding = lambda: []
    return site


def test_a_server_off_at_start_counts_the_range_discovery_stored_else_is_refused():
    from orchestrator.errors import ConfigError
    from orchestrator.nodes.sitestore import StoredRange

    h100 = {("B", i): StoredRange(200.0, 700.0) for i in (0, 1)}
    with pytest.raises(ConfigError, match=r"1500 W could never wake node B .*\(1400 W\)"):
        _h100_site(1500.0, h100).check()  # 2 x 700 W + A's 2 x 100 W: not 2 x 300 W guessed
    site = _h100_site(1600.0, h100)
    site.check()
    assert sorted(g.high_w for g in site.gpus.values()) == [300.0, 300.0, 700.0, 700.0]
    with pytest.raises(ConfigError, match="never read: power it on once"):
        _h100_site(1600.0, {}).check()


def test_a_server_powering_off_that_the_executor_lists_unreachable_counts_its_highest():
    from tests.test_power_limit_rightsize import _running

    site, s, states = _site(800.0, {"B": "on"})
    unreach = {}
    site.unreachable = lambda: unreach
    site.check()
    site._holding = lambda: [_running(site, "A")]
    site.rebalance()
    s["B"].down, unreach["B"], s["B"].lim = True, 0.0, {0: 300.0, 1: 300.0}  # rebooted
    states["B"] = "powering off"
    site.rebalance()
    assert site.in_force_w() == 600.0 + 200.0 and s["A"].lim == {0: 100.0, 1: 100.0}


def test_right_sizing_does_not_power_off_a_server_the_executor_lists_unreachable(tmp_path):
    sizer, alloc, _ = _sizer(tmp_path, ["/bin/true"], ["/bin/true"])
    sizer.unreachable = lambda: {"a": 0.0}
    sizer.restore(time.time() - 60, {})
    alloc.hold(("attempt", 1), "b", [0, 1])
    for i in range(3):
        sizer.step(alloc, [], time.time() + i)
    assert sizer.nodes["a"].state == "on" and not sizer.nodes["a"].busy


def test_the_start_check_of_a_wake_does_not_depend_on_which_servers_are_on():
    from orchestrator.errors import ConfigError

    for stored in ({"B": "off", "C": "off"}, {"B": "on", "C": "off"}):
        site, _, _ = _site(800.0, stored, names=("A", "B", "C"))
        site.check()  # C: 600 W + A's 200 W; B may be powered off
    for stored in ({"B": "off", "C": "off"}, {"B": "on", "C": "off"}):
        site, _, _ = _site(799.0, stored, names=("A", "B", "C"))
        with pytest.raises(ConfigError, match="could never wake node B"):
            site.check()


def test_a_wake_admitted_drops_its_jobs_refusal_and_cancelled_jobs_notes_go(tmp_path):
    from orchestrator.daemon.energy.rightsizing import MAY_BE_ON

    site, s, states = _site(1000.0, {"B": "off", "C": "off"}, names=("A", "B", "C"))
    site.check()
    site.rebalance()
    assert site.wakes("B", ("job", 8))
    states["B"] = MAY_BE_ON
    assert not site.wakes("C", ("job", 9)) and 9 in site.refused
    s["B"].down, states["B"] = False, "on"
    site.rebalance()
    assert site.wakes("C", ("job", 9)) and 9 not in site.refused


def test_the_refusals_of_jobs_that_no_longer_wait_are_dropped_at_the_rebalance(tmp_path):
    from datetime import UTC, datetime

    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Job

    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    with db.write() as session:
        for i, state in ((1, "queued"), (2, "cancelled"), (3, "running")):
            session.add(Job(id=i, state=state, user="u", uid=1, workdir="/", gpus_min=1,
                            gpus_max=1, submitted_at=datetime.now(UTC)))  # fmt: skip
    site, _, _ = _site(1000.0, {"B": "off"})
    site.check()
    site.db, site.refused = db, {1: "why", 2: "why", 3: "why", 4: "why"}
    site.rebalance()
    assert site.refused == {1: "why"}


@pytest.mark.backends("sqlite", "postgresql")
def test_idle_energy_is_summed_per_node_by_the_database_carbon_unknown_if_any_row_lacks_it(
    db_url,
):
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from orchestrator.accounting.reports import idle_energy
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import IdleUsage, Node

    db = Database(db_url)
    db.ensure_schema()
    h0 = datetime(2026, 1, 1, tzinfo=UTC)
    with db.write() as session:
        for name in ("a", "b"):
            session.add(Node(name=name, executor="ssh", gpus=2, gpu_source="config",
                             updated_at=h0))  # fmt: skip
    with db.write() as session:
        for h in range(48):  # a: carbon known every hour; b: one hour without a signal
            at = h0 + timedelta(hours=h)
            session.add(IdleUsage(node="a", hour=at, energy_j=3.6e6, carbon_g=100.0))
            session.add(IdleUsage(node="b", hour=at, energy_j=1.8e6, carbon_g=50.0))
    with db.write() as session:
        row = session.get(IdleUsage, ("b", h0 + timedelta(hours=30)))
        row.carbon_g = None
        session.add(row)
    sql = []
    listen = lambda *a: sql.append(a[2])  # noqa: E731
    event.listen(Engine, "before_cursor_execute", listen)
    try:
        with db.read() as session:
            got = idle_energy(session, h0 + timedelta(hours=24, minutes=30))
    finally:
        event.remove(Engine, "before_cursor_execute", listen)
    assert got["by_node"]["a"] == {"energy_kwh": 24.0, "carbon_kg": 2.4}
    assert got["by_node"]["b"] == {"energy_kwh": 12.0, "carbon_kg": None}
    assert got["energy_kwh"] == 36.0 and got["carbon_kg"] is None
    assert any("GROUP BY" in s.upper() and "SUM(" in s.upper() for s in sql), sql


def test_the_gpu_ranges_discovery_read_survive_the_inventory_a_restart_replaces(tmp_path):
    """A server off across two restarts keeps the range its GPUs were last read at."""
    from executors.gpu.base import GpuInfo
    from orchestrator.nodes.inventory import ResolvedNode, sync_inventory
    from orchestrator.nodes.sitestore import StoredRange, stored_ranges
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Gpu

    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    nodes = [ResolvedNode("B", "ssh", tuple(GpuInfo(i, f"b{i}", "H100") for i in (0, 1)),
                          "stored")]  # fmt: skip
    with db.write() as session:
        sync_inventory(session, nodes, datetime.now(UTC))
    with db.write() as session:  # discovery read them while it was on
        for i in (0, 1):
            gpu = session.get(Gpu, ("B", i))
            gpu.power_min_w, gpu.power_max_w, gpu.power_default_w = 200.0, 700.0, 700.0
            session.add(gpu)
    for _restart in range(2):  # off since: not read again
        with db.write() as session:
            sync_inventory(session, nodes, datetime.now(UTC))
    assert stored_ranges(db, ["B"]) == {("B", i): StoredRange(200.0, 700.0) for i in (0, 1)}
