"""A what-if run's power limit that no job could start under is refused up front (QA:
``--power-limit`` above the idle draw but below what the smallest job needs ran, every job
over the limit); jobs that need more than the limit even alone are noted, and ``budget``
plans them alone instead of deferring them a slot at a time, forever (QA: ``--power-limit
3kW`` on examples/whatif.toml's 32 V100s never ended)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orchestrator.errors import SpecError
from orchestrator.planning.perfmodel import JobModel, curve_for
from orchestrator.planning.policies import resolve_policy
from orchestrator.planning.policies.base import Commitment
from tests.conftest import ROOT, base_env
from tests.test_planner import A40, DAY0, H, job, snap

# 4 servers of 8 V100s; every number of the power model given, so the test computes the
# least limit itself: servers on and idle, less one smallest job's GPUs' idle share, plus
# that job on them at the V100's lowest cap
CLUSTER = {"gpus": 32, "gpus_per_node": 8, "gpu": "v100", "host_w_per_gpu": 50.0,
           "pue": 1.2, "node_idle_w": 160.0, "gpu_idle_w": 40.0}  # fmt: skip
JOBS = "synthetic:count=30&days=2"


def _scenario(limit_w: float | None, policies=("fifo",)):
    from orchestrator.sim.scenario import Scenario

    return Scenario.model_validate(
        {
            "policies": list(policies),
            "jobs": {"source": JOBS},
            "grid": {"source": "synthetic:days=10"},
            "cluster": CLUSTER,
            **({"power_limit_w": limit_w} if limit_w is not None else {}),
        }
    )


def _needs_w() -> tuple[float, np.ndarray]:
    """The idle draw and each job's least limit, by hand from the cluster's numbers."""
    from orchestrator.sim.inputs import prepare

    gpus = prepare(_scenario(None), ROOT).jobs.gpus  # the trace's widths (not elastic)
    pue, v100 = CLUSTER["pue"], curve_for("v100")
    idle_w = 4 * (CLUSTER["node_idle_w"] + 8 * CLUSTER["gpu_idle_w"]) * pue
    share_w = (CLUSTER["node_idle_w"] / 8 + CLUSTER["gpu_idle_w"]) * pue  # one idle GPU
    busy_w = (v100.power_w(v100.min_fraction) + CLUSTER["host_w_per_gpu"]) * pue
    return idle_w, idle_w + gpus * (busy_w - share_w)


def test_the_least_limit_runs_and_just_below_it_is_refused_in_one_line():
    from orchestrator.sim.runner import simulate

    idle_w, need_w = _needs_w()
    least_w = float(need_w.min())
    assert idle_w < least_w - 1  # above the idle draw: not SimSiteLimit's refusal
    with pytest.raises(SpecError, match="smallest job needs") as err:
        simulate(_scenario(least_w - 0.5), ROOT)
    message = str(err.value)
    assert "\n" not in message and f"give at least {np.ceil(least_w):.0f} W" in message
    assert "1 v100 GPU at its lowest cap" in message
    outcome = simulate(_scenario(least_w, ("fifo", "budget")), ROOT)
    for name, m in outcome.results.items():
        assert m["jobs"] == 30, name  # every job ran (the widest alone, over the limit)
    assert m["limit_exceeded"] is bool((need_w > least_w + 1e-6).any())


def test_jobs_that_need_more_than_the_limit_alone_are_noted_and_still_run():
    from orchestrator.sim.runner import simulate

    _, need_w = _needs_w()
    limit_w = float(np.sort(need_w)[-1] - 1.0)  # every job but the widest fits alone
    wide = int((need_w > limit_w).sum())
    outcome = simulate(_scenario(limit_w, ("fifo", "budget")), ROOT)
    notes = outcome.to_json()["scenario"]["notes"]
    said = [n for n in notes if "even alone at the lowest cap" in n]
    assert len(said) == 1 and said[0].startswith(f"{wide} job")
    assert f"up to {need_w.max() / 1000:.2f} kW" in said[0]
    for m in outcome.results.values():
        assert m["jobs"] == 30 and m["limit_exceeded"] is True
    # a limit every job fits alone under: no note
    held = simulate(_scenario(float(need_w.max()) + 1.0), ROOT)
    assert not [n for n in held.to_json()["scenario"]["notes"] if "alone" in n]


def test_budget_plans_a_job_wider_than_the_limit_alone_not_a_slot_later_each_time():
    """Its deadline gone, a job whose draw is over the whole limit was planned at the
    horizon's end (no slot ever had its watts), so every replan moved it a slot on."""
    wide = job(1, gpus=4, run_h=1.0, deadline_h=1.0)  # its deadline passed: forced
    now = DAY0 + 5 * H
    model = JobModel(H, 4, A40)
    limit_w = 0.5 * model.power_w(4, A40.min_fraction)  # not even at its lowest cap
    s = snap([wide], [300.0] * 200, total=8, power_limit_w=limit_w, now_s=now)
    d = resolve_policy("budget").plan(s)[1]
    assert d.forced and d.start_s == now
    # another job's draw committed: it does not start beside it (it needs the whole limit)
    s.committed = [Commitment(9, 2, 0.1 * limit_w, now - H, now + 2 * H)]
    assert resolve_policy("budget").plan(s)[1].start_s > now


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "simulate", *args, "--json"],
        env=base_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _toml(tmp_path: Path, limit: str | None = None) -> Path:
    lines = [f'policies = ["fifo"]\n[jobs]\nsource = "{JOBS}"\n',
             '[grid]\nsource = "synthetic:days=10"\n[cluster]\n',
             *(f"{k} = {v!r}\n".replace("'", '"') for k, v in CLUSTER.items())]  # fmt: skip
    if limit is not None:
        lines.insert(0, f'power_limit_w = "{limit}"\n')
    path = tmp_path / "s.toml"
    path.write_text("".join(lines))
    return path


def test_simulate_refuses_a_limit_no_job_could_start_under_exit_2(tmp_path):
    idle_w, need_w = _needs_w()
    below = f"{(idle_w + need_w.min()) / 2:.0f}W"  # over the idle draw, under any job
    for args, named in (([str(_toml(tmp_path)), "--power-limit", below], "--power-limit: "),
                        ([str(_toml(tmp_path, below))], "invalid power_limit_w: ")):  # fmt: skip
        proc = _cli(tmp_path, *args)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "smallest job needs" in lines[0] and not proc.stdout
        assert f"give at least {np.ceil(need_w.min()):.0f} W" in lines[0]
        assert lines[0].startswith(f"gridshift: error: {named}"), lines[0]  # who gave it (QA)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]  # nothing written


def test_a_limit_under_the_idle_draw_names_the_flag_that_gave_it(tmp_path):
    """QA: ``simulate --power-limit 1W`` said "invalid power_limit_w:", the scenario's key."""
    for args, named in ((["--power-limit", "1W"], "--power-limit: "),
                        ([], "invalid power_limit_w: ")):  # fmt: skip
        proc = _cli(tmp_path, str(_toml(tmp_path, None if args else "1W")), *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"gridshift: error: {named}1 W is less than the cluster's idle")


@pytest.mark.parametrize("bad", ["12 parsecs", "3kWh", "-5kW", "0W", "nan", "1e400W"])
def test_a_limit_in_odd_units_is_still_refused_as_before(tmp_path, bad):
    proc = _cli(tmp_path, str(_toml(tmp_path)), "--power-limit", bad)
    assert proc.returncode == 2 and "invalid power" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not proc.stdout
