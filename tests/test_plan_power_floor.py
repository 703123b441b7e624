"""``plan --power-limit`` refuses a limit no queued job could start under (QA: under 250 W,
or 1 W, three 2-GPU jobs were all planned at 100 % cap, 600 W, marked as started by their
deadline 12 h away, exit 0). The least limit is the plan's own model's: each job's most
frugal option in watts, as the planners choose from (``problem.job_configs``)."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.errors import SpecError
from orchestrator.planning.limitfloor import check_plan_limit
from orchestrator.planning.perfmodel import JobModel, curve_for
from orchestrator.planning.policies.base import QueuedJob
from orchestrator.planning.policies.problem import job_configs
from tests.test_planner import job, snap


def _least_w(*jobs) -> float:
    return min(c.power_w for j in jobs for c in job_configs(j))


def test_a_limit_under_every_jobs_least_option_is_refused_at_the_boundary():
    jobs = [job(1, gpus=2), job(2, gpus=4), job(3, gpus=1)]
    least_w = _least_w(*jobs)  # the 1-GPU job's most frugal option
    assert least_w == pytest.approx(min(c.power_w for c in job_configs(jobs[2])))
    for ok in (least_w, float(np.ceil(least_w)), 1e6):
        check_plan_limit(snap(jobs, [300.0] * 48, power_limit_w=ok), "--power-limit")
    for below in (least_w - 0.01, float(np.floor(least_w)) - 1, 1.0, 1e-9):
        with pytest.raises(SpecError) as err:
            check_plan_limit(snap(jobs, [300.0] * 48, power_limit_w=below), "--power-limit")
        message = str(err.value)
        assert "\n" not in message and message.startswith("--power-limit: ")
        assert message.endswith(f"give at least {np.ceil(least_w):.0f} W")
        assert "1 GPU at a " in message and "% cap" in message


def test_no_limit_no_jobs_or_jobs_that_draw_nothing_refuse_nothing():
    check_plan_limit(snap([job(1, gpus=2)], [300.0] * 48), "--power-limit")  # no limit
    check_plan_limit(snap([], [300.0] * 48, power_limit_w=1.0), "--power-limit")
    cpu = QueuedJob(1, 0, 0.0, duration_s=3600.0)  # no GPU: nothing the limit counts
    check_plan_limit(snap([cpu, job(2, gpus=2)], [300.0] * 48, power_limit_w=1.0), "x")
    unknown = QueuedJob(1, 2, 0.0)  # no run time, no model: 350 W a GPU, as planned
    with pytest.raises(SpecError, match=r"give at least 700 W$"):
        check_plan_limit(snap([unknown], [300.0] * 48, power_limit_w=699.0), "--power-limit")


def _qa_least_w() -> int:
    """Three 2-GPU jobs of an hour on the fake GPUs' generic curve: their most frugal
    option, rounded up (what the message asks for)."""
    model = JobModel(3600.0, 2, curve_for(None))
    q = QueuedJob(1, 2, 0.0, duration_s=3600.0, model=model, min_gpus=2, max_gpus=2)
    return int(np.ceil(_least_w(q)))


@pytest.mark.backends("sqlite")
def test_plan_refuses_a_power_limit_no_job_could_start_under(cli):
    for _ in range(3):
        cli.submit("--gpus", "2", "--duration", "1h", "--within", "12h", "--", "true")
    least = _qa_least_w()
    grid = ("--grid", "synthetic:replay=now")
    for below in ("250W", "1W", f"{least - 1}W", "0.25kW"):
        proc = cli.run("plan", *grid, "--power-limit", below, check=False)
        assert proc.returncode == 2, (below, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "--power-limit" in lines[0] and not proc.stdout
        assert lines[0].endswith(f"give at least {least} W"), lines[0]
    data = cli.json("plan", *grid, "--power-limit", f"{least}W")  # the boundary holds
    assert data["power_limit_w"] == least and len(data["jobs"]) == 3
    assert data["jobs"][0]["cap"] < 1.0  # the first runs capped under the limit
    assert not any(r["forced"] for r in data["jobs"])  # deadlines 12 h away: none forced
