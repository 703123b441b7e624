"""Budgets kept online in the daemon and ``plan`` (issue 21): a start a deadline forces
beyond the budget is named, with its grams, in ``show`` and ``budget``; the daemon's
planner keeps part of the period's budget for the jobs expected to arrive."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

INTENSITY = 500.0  # g/kWh, flat: any run spends


def _flat_trace(path: Path, t0: int) -> None:
    lines = ["time,carbon_g_per_kwh"]
    lines += [
        f"{datetime.fromtimestamp(t0 + i, UTC).isoformat()},{INTENSITY}" for i in range(-120, 900)
    ]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.backends("sqlite")  # the daemon's planning, not the store's backend
def test_a_start_forced_beyond_the_budget_is_named_with_its_grams(cli, tmp_path):
    trace = tmp_path / "flat.csv"
    _flat_trace(trace, int(time.time()))
    cli.daemon(
        "--grid", f"csv:{trace}", "--slot", "1s", "--interval", "0.2", "--budget", "1g/day"
    )  # killed after
    # about 0.1 g: within the budget, not forced
    free = cli.submit("--now", "--duration", "2s", "--gpus", "1", "--", "sleep", "0.2")
    cli.wait_state(free, {"completed"}, timeout=30)
    # about 2.5 g, and its deadline lets it wait at most a second or two: forced
    forced = cli.submit("--duration", "60s", "--within", "62s", "--gpus", "1", "--", "sleep", "0.2")
    shown = cli.wait_state(forced, {"completed"}, timeout=30)
    assert shown["forced_g"] > 1.0 and shown["forced_kwh"] > 0
    assert shown["runs"][0]["forced_g"] == shown["forced_g"]
    assert cli.json("show", str(free))["forced_g"] is None
    budget = cli.json("budget", "--budget", "1g/day")
    (named,) = budget["forced"]
    assert named["job"] == forced and named["g"] == pytest.approx(shown["forced_g"], rel=1e-3)
    assert budget["forced_g"] == named["g"] and budget["periods"][-1]["forced_g"] == named["g"]
    energy = cli.json("budget", "--budget", "1kWh/day")  # the same start, in Wh
    assert energy["forced"][0]["g"] == pytest.approx(1e3 * shown["forced_kwh"], rel=1e-3)
    text = cli.run("budget", "--budget", "1g/day").stdout
    assert f"forced job {forced}" in text and f"job {free} " not in text
    assert "forced by its deadline" in cli.run("show", str(forced)).stdout
