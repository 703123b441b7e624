"""A job's own checkpoint cost (``submit --checkpoint-cost``): stored, shown, planned with
(else the lab's ``daemon.checkpoint_cost``), bounded like the lab's; and ``simulate
--checkpoint-cost`` for the interruptible jobs of a what-if run."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.errors import SpecError
from orchestrator.sim.runner import simulate
from orchestrator.sim.scenario import Scenario
from tests.conftest import ROOT


def test_submit_stores_and_shows_the_jobs_own_cost(cli):
    made = cli.json("submit", "--interruptible", "--checkpoint-cost", "10m", "--", "true")
    assert cli.json("show", str(made["id"]))["checkpoint_s"] == 600.0
    plain = cli.json("submit", "--interruptible", "--", "true")  # the lab's cost
    assert cli.json("show", str(plain["id"]))["checkpoint_s"] is None
    text = cli.run("show", str(made["id"])).stdout
    assert re.search(r"checkpoint\s+10m", text), text  # show prints durations, --json seconds


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"checkpoint_cost": "2d", "interruptible": True}, "0 to one day"),
        ({"checkpoint_cost": "365d", "interruptible": True}, "0 to one day"),
        ({"checkpoint_cost": -1, "interruptible": True}, "0 to one day"),
        ({"checkpoint_cost": "soon", "interruptible": True}, "invalid checkpoint cost"),
        ({"checkpoint_cost": True, "interruptible": True}, "invalid checkpoint cost"),
        ({"checkpoint_cost": "10m"}, "--interruptible jobs only"),
    ],
)
def test_a_sweep_lines_checkpoint_cost_is_checked(tmp_path, raw, words):
    from orchestrator.queue.spec import build_spec

    now = datetime(2026, 11, 23, tzinfo=UTC)
    with pytest.raises(SpecError) as err:
        build_spec({"command": ["true"], **raw}, now=now, cwd=str(tmp_path), base_env={})
    assert words in str(err.value)


def test_the_lab_setting_is_bounded_like_the_jobs_own():
    from pydantic import ValidationError

    from orchestrator.settings import DaemonSettings

    assert DaemonSettings(checkpoint_cost="0").seconds("checkpoint_cost") == 0.0
    assert DaemonSettings(checkpoint_cost="1d").seconds("checkpoint_cost") == 86400.0
    for bad in ("365d", "25h", "soon"):
        with pytest.raises(ValidationError, match="checkpoint cost"):
            DaemonSettings(checkpoint_cost=bad)


def test_the_daemons_planner_plans_with_the_jobs_own_cost_else_the_labs():
    from orchestrator.daemon.planner import LivePlanner
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.queue.models import Job

    now = datetime(2026, 11, 23, 10, tzinfo=UTC)
    planner = LivePlanner(resolve_policy("fifo"), 900.0, curve_for("a40"), checkpoint_s=420.0)

    def job(job_id: int, checkpoint_s: float | None) -> Job:
        return Job(id=job_id, state="queued", user="a", uid=1000, command=["x"], workdir="/",
                   gpus_min=1, gpus_max=1, submitted_at=now, duration_s=3600.0,
                   interruptible=True, checkpoint_s=checkpoint_s,
                   deadline=now + timedelta(days=1))  # fmt: skip

    scheduler = planner.schedule(now, [job(1, 1200.0), job(2, None), job(3, 0.0)], {}, [], 8, 8, 0)
    costs = {view.id: view.checkpoint_s for view, _ in scheduler.planned()}
    assert costs == {1: 1200.0, 2: 420.0, 3: 0.0}


def _whatif(**jobs) -> Scenario:
    return Scenario.model_validate(
        {
            "policies": ["fifo", "budget"],
            "jobs": {"source": "synthetic:count=150&days=14", "interruptible": 0.5, **jobs},
            "grid": {"source": "synthetic:mean=300&days=21&solar=0.35&weekly=0.1&noise=0.08"},
            "cluster": {"gpus": 32},
        }
    )


def test_simulate_plans_with_the_scenarios_checkpoint_cost():
    free = simulate(_whatif(checkpoint_cost="0"), ROOT)
    dear = simulate(_whatif(checkpoint_cost="1d"), ROOT)
    assert simulate(_whatif(), ROOT).inputs.checkpoint_s == 300.0  # the default, 5m
    assert free.to_json()["scenario"]["checkpoint_s"] == 0.0
    assert dear.to_json()["scenario"]["checkpoint_s"] == 86400.0
    # a restart that costs a day of run time is never worth it; a free one often is
    assert dear.results["budget"]["suspensions"] == 0
    assert free.results["budget"]["suspensions"] > 0


@pytest.mark.backends("sqlite")
def test_simulate_flag_is_echoed_and_bounded(cli):
    example = str(ROOT / "examples" / "whatif.toml")
    args = ("simulate", example, "--policy", "fifo", "--max-jobs", "30", "--json")
    data = cli.json(*args, "--checkpoint-cost", "10m")
    assert data["scenario"]["checkpoint_s"] == 600.0
    proc = cli.run(*args, "--checkpoint-cost", "2d", check=False)
    assert proc.returncode == 2 and "checkpoint cost '2d'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
