"""The plots: ``simulate --plot`` (time axes with the year and the zone, titles naming the
scenario, deadline misses drawn), ``report --plot`` (the period and the saving) and
``show ID --plot`` (a job's power and the grid's carbon over its run). Figures are
inspected as matplotlib objects, not pixels; files are checked to be PNGs."""

from __future__ import annotations

import pytest

from orchestrator.sim.plots import figures, missed, write_plots
from orchestrator.sim.runner import simulate
from orchestrator.sim.scenario import Scenario
from tests.conftest import ROOT

PNG = b"\x89PNG\r\n\x1a\n"
pytestmark = pytest.mark.backends("sqlite")


def _texts(fig) -> str:
    """Every title, axis label, tick label and annotation of a figure, as one text."""
    parts = [fig._suptitle.get_text() if fig._suptitle else ""]
    for ax in fig.axes:
        parts += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        parts += [t.get_text() for t in ax.texts]
        parts += [t.get_text() for t in ax.get_yticklabels()]
    return "\n".join(parts)


@pytest.fixture(scope="module")
def outcome():
    """A small cluster and tight deadlines in Berlin: some jobs miss them."""
    scenario = Scenario.model_validate(
        {
            "name": "tight lab",
            "policies": ["fifo", "lowest-window"],
            "timezone": "Europe/Berlin",
            "forecast": "naive",
            "budget": "30kg/day",
            "jobs": {"source": "synthetic:count=80&days=3", "deadline_rule": "within:1h"},
            "grid": {"source": "synthetic:days=7"},
            "cluster": {"gpus": 8},
        }
    )
    return simulate(scenario, ROOT)


def test_simulate_plots_name_the_scenario_year_and_zone(outcome, tmp_path):
    figs = figures(outcome)
    power, bars = figs["carbon_power"], figs["carbon_vs_jct"]
    for fig in (power, bars):
        text = _texts(fig)
        for said in ("tight lab", "rule within:1h", "forecast naive", "budget 30kg/day"):
            assert said in text, (said, text)
        assert "Europe/Berlin" in text
    start_year = outcome.inputs.jobs.submit_s.min()
    from datetime import UTC, datetime

    year = str(datetime.fromtimestamp(float(start_year), UTC).year)
    assert year in power.axes[-1].get_xlabel()
    # the time ticks carry the year too, in the scenario's zone
    fmt = power.axes[-1].xaxis.get_major_formatter()
    assert "%Y" in fmt.fmt and str(fmt.tz) == "Europe/Berlin"
    paths = write_plots(outcome, tmp_path / "plots")
    assert [p.name for p in paths] == ["carbon_power.png", "carbon_vs_jct.png"]
    for p in paths:
        assert p.read_bytes()[:8] == PNG


def test_simulate_plots_draw_each_missed_deadline(outcome):
    figs = figures(outcome)
    total = 0
    misses_ax = figs["carbon_power"].axes[-1]
    for row, name in enumerate(outcome.runs):
        due = missed(outcome, name)
        assert len(due) == outcome.results[name]["deadline_misses"]
        total += len(due)
        assert f"{name}: {len(due)}" in [t.get_text() for t in misses_ax.get_yticklabels()]
        assert len(misses_ax.collections[row].get_offsets()) == len(due)
    assert total > 0  # the scenario is tight enough to miss some
    bar_ax = figs["carbon_vs_jct"].axes[2]
    assert "deadline misses" in bar_ax.get_ylabel()
    heights = [p.get_height() for p in bar_ax.patches]
    assert heights == [outcome.results[n]["deadline_misses"] for n in outcome.results]


# -- report --plot and show --plot ---------------------------------------------------


def _ran_one_job(cli) -> int:
    """One job run to completion under fake GPUs drawing 300 W, sampled every 0.2 s for 1 s, on a
    synthetic signal that covers today."""
    from datetime import UTC, datetime, timedelta

    day = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    cli.env["GRIDSHIFT_GRID__SOURCE"] = f'["synthetic:start={day}&days=3&step=15m"]'
    cli.env["GRIDSHIFT_FAKE_GPU_POWER_W"] = "300"
    cli.env["GRIDSHIFT_DAEMON__POWER_SAMPLE"] = "0.2s"
    job_id = cli.submit("--now", "--name", "tiny", "--gpus", "2", "--", "sleep", "1")
    cli.run_until_idle()
    return job_id


def test_show_and_report_plot_a_job_that_ran(cli, tmp_path):
    from orchestrator.accounting.plots import report_figure

    job_id = _ran_one_job(cli)
    shown = cli.run("show", str(job_id), "--plot", str(tmp_path / "job.png"))
    assert (tmp_path / "job.png").read_bytes()[:8] == PNG, shown.stderr
    made = cli.run("report", "--plot", str(tmp_path / "report.png"))
    assert (tmp_path / "report.png").read_bytes()[:8] == PNG, made.stderr
    data = cli.json("report")
    assert data["first_submitted_at"] and data["last_finished_at"]
    text = _texts(report_figure(data))
    year = data["first_submitted_at"][:4]
    assert f"jobs submitted from {year}-" in text and "saving against running at" in text
    assert "1 job" in text


def test_show_plot_of_a_job_that_never_ran_is_one_line(cli, tmp_path):
    job_id = cli.submit("--within", "24h", "--", "true")
    proc = cli.run("show", str(job_id), "--plot", str(tmp_path / "x.png"), check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "has not run yet" in proc.stderr
    assert not (tmp_path / "x.png").exists()


def test_job_figure_shades_the_run_by_carbon_and_shows_the_suspension():
    from datetime import UTC

    from orchestrator.accounting.plots import job_figure

    t0 = 1_700_000_000.0  # 2023-11-14 22:13 UTC
    data = {
        "job": 7,
        "name": "resnet",
        "state": "completed",
        "runs": [
            {"attempt": 1, "start_s": t0, "end_s": t0 + 1800, "modelled_w": 600.0,
             "samples": [], "gpus": 2, "cap": None, "state": "suspended",
             "energy_modelled": True},
            {"attempt": 2, "start_s": t0 + 5400, "end_s": t0 + 7200, "modelled_w": None,
             "samples": [[t0 + 5400 + 60 * i, 500.0 + i] for i in range(30)], "gpus": 2,
             "cap": 0.6, "state": "completed", "energy_modelled": False},
        ],
        "events": [{"at": "2023-11-14T22:43:20+00:00", "to": "suspended", "reason": "plan"}],
        "carbon": {"source": "synthetic:", "zone": "SYN", "unit": "g/kWh",
                   "start_s": t0 - 3600, "step_s": 900.0,
                   "values": [200.0 + 10 * i for i in range(16)]},
    }  # fmt: skip
    fig = job_figure(data, UTC)
    text = _texts(fig)
    assert "job 7 (resnet), completed" in text and "2 attempts" in text
    assert "time (UTC), 2023-11-14 22:13" in text and "suspended" in text
    assert "carbon intensity (g/kWh)" in text  # the colour bar
    power = fig.axes[1]
    bars = [p for p in power.patches if p.get_height() > 0]
    colours = {p.get_facecolor() for p in bars}
    assert len(colours) > 3  # the area takes the colour of each slot's carbon


def test_job_power_is_its_owners_alone(tmp_path, db_url):
    """In a shared queue another member may not draw your job (its power is what
    ``show`` in full would tell them)."""
    from datetime import UTC, datetime

    from orchestrator.daemon.ops import handle
    from orchestrator.daemon.ops.base import Caller, OpContext
    from orchestrator.errors import PermissionDenied, SpecError
    from orchestrator.queue import store
    from orchestrator.queue.db import Database
    from orchestrator.queue.ownership import User
    from orchestrator.queue.spec import build_spec
    from orchestrator.settings import Settings

    home = tmp_path / "home"
    home.mkdir()
    db = Database(db_url)
    db.ensure_schema()
    now = datetime.now(UTC)
    spec = build_spec({"command": ["true"], "workdir": str(tmp_path)}, now=now,
                      cwd=str(tmp_path), base_env={})  # fmt: skip
    (job,) = store.submit(db, [spec], user=User("alice", 1001), now=now, largest_node_gpus=2)
    settings = Settings(home=home, fake_gpus=2, database_url=db_url)
    ctx = OpContext(settings, open_db=lambda: db, daemon_running=lambda: True, owner_uid=0)
    with pytest.raises(PermissionDenied):
        handle(ctx, Caller("bob", 1002), "job_power", {"job_id": job.id})
    with pytest.raises(SpecError, match="has not run yet"):
        handle(ctx, Caller("alice", 1001), "job_power", {"job_id": job.id})
    db.dispose()
