"""The site power limit on the live daemon: the real CLI and daemon on fake GPUs whose
limits persist in a file (``fake-gpus.json``: each GPU's limit changes with their times).
Jobs arrive and end while a sampler reads the fakes' limits; the sum of the limits in
force never exceeds the site limit, neither in the samples nor at any moment of the
fakes' own history (every change replayed, an increase first where two share a time).
Bad limits are one line and exit 2; ``plan --power-limit`` plans under the limit."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import E2E

LIMIT_W = 700.0  # four fake GPUs, 100-300 W each: 400 W parked, 300 W to share
GPUS = 4


def _limits(path: Path) -> dict[str, list[list[float]]]:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _replayed_max(history: dict[str, list[list[float]]]) -> tuple[float, float]:
    """The largest sum of the limits in force at any moment once every GPU has been set
    (before that, the fakes are at their default: the daemon had not started), and the
    smallest limit any GPU had while a job ran on it (to see the split at work)."""
    events = sorted(
        ((t, -w, gpu, w) for gpu, changes in history.items() for t, w in changes),
    )  # at one time, the higher limit first: the worst order
    now: dict[str, float] = {}
    worst = 0.0
    for _t, _neg, gpu, w in events:
        now[gpu] = w
        if len(now) == GPUS:
            worst = max(worst, sum(now.values()))
    return worst, min((w for ch in history.values() for _, w in ch if w > 100.5), default=0)


@pytest.mark.backends("sqlite")
@E2E
def test_the_site_limit_holds_on_fake_gpus_through_arrivals_and_ends(cli):
    state = cli.home / "fake-gpus.json"
    for seconds in (1, 2, 1):
        cli.submit("--gpus", "1", "--", "sleep", str(seconds))
    wide = cli.submit("--gpus", "2", "--", "sleep", "1")
    seen: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            limits = _limits(state)
            if len(limits) == GPUS:
                seen.append(sum(changes[-1][1] for changes in limits.values()))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    daemon = cli.daemon("--interval", "0.1", "--power-limit", "0.7kW")
    try:
        cli.wait_state(1, {"running"}, timeout=30)
        late = [cli.submit("--gpus", "1", "--", "sleep", "1") for _ in range(2)]  # arrivals
        for job in [1, 2, 3, wide, *late]:
            cli.wait_state(job, {"completed"}, timeout=60)
        site = cli.json("status")["power_limit"]  # status shows it
        assert site["limit_w"] == LIMIT_W and site["gpus"] == GPUS
        assert 4 * 100.0 <= site["in_force_w"] <= LIMIT_W
    finally:
        stop.set()
        sampler.join()
        daemon.terminate()
        daemon.wait(timeout=30)
    history = _limits(state)
    worst, lowest_shared = _replayed_max(history)
    assert seen and max(seen) <= LIMIT_W + 1e-6
    assert worst <= LIMIT_W + 1e-6, history
    assert 100.5 < lowest_shared < 300.0  # jobs ran at once, each on a share under 300 W
    # the daemon stopped: the limits stay as they were (none back at its 300 W default)
    assert sum(changes[-1][1] for changes in history.values()) <= LIMIT_W + 1e-6


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--power-limit", "abc"], "invalid power 'abc'"),
        (["--power-limit", "0"], "more than 0 W"),
        (["--power-limit", "15kWh"], "invalid power"),
        (["--power-limit", "-1kW"], "invalid power"),
        (["--power-limit", "300W"], "lowest power limits together (400 W)"),
        (["--power-limit", "0.5W"], ": 0.5 W is less than the 4 GPUs'"),  # not "0 W"
    ],
)
def test_bad_site_limits_are_one_line_and_exit_2(cli, args, message):
    proc = cli.run("daemon", "--until-idle", *args, check=False)
    assert proc.returncode == 2 and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (cli.home / "fake-gpus.json").exists()  # no limit was touched


@pytest.mark.backends("sqlite")
def test_a_site_limit_that_cannot_be_held_is_refused(cli):
    cli.env["GRIDSHIFT_DAEMON__POWER_CAPS"] = "false"  # limits that cannot be set
    proc = cli.run("daemon", "--until-idle", "--power-limit", "1kW", check=False)
    assert proc.returncode == 2 and "cannot be set" in proc.stderr
    cli.env.pop("GRIDSHIFT_DAEMON__POWER_CAPS")
    cli.env["GRIDSHIFT_DAEMON__POWER_LIMIT"] = "lots"  # the config's, as bad
    proc = cli.run("daemon", "--until-idle", check=False)
    assert proc.returncode == 2 and "daemon.power_limit" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.backends("sqlite")
def test_plan_under_a_power_limit(cli, tmp_path):
    from datetime import UTC, datetime, timedelta

    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    rows = ["time,carbon_g_per_kwh"]  # falling for 6 hours, then flat: all want the end
    rows += [f"{(start + timedelta(hours=h)).isoformat()},{max(100, 700 - 100 * h)}"
             for h in range(72)]  # fmt: skip
    trace = tmp_path / "trace.csv"
    trace.write_text("\n".join(rows) + "\n")
    for _ in range(3):
        cli.submit("--gpus", "2", "--duration", "2h", "--within", "5h", "--", "true")
    free = cli.json("plan", "--grid", f"csv:{trace}")
    held = cli.json("plan", "--grid", f"csv:{trace}", "--power-limit", "0.5kW")
    assert free["power_limit_w"] is None and held["power_limit_w"] == 500.0
    starts = lambda d: sorted(r["start"] for r in d["jobs"])  # noqa: E731
    assert starts(held) != starts(free)  # not all at once: under 0.5 kW they take turns
    bad = cli.run("plan", "--power-limit", "lots", check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--power-limit" in bad.stderr
