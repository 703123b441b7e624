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


def test_job_power_streams_a_large_power_log(tmp_path):
    """A long job's power log is read a chunk at a time and thinned as it goes: what is
    held stays bounded whatever the log's size, and the mean power stays exact."""
    import tracemalloc

    from executors import runfiles
    from orchestrator.daemon.ops import jobpower

    lines = 250_000  # ~7 MB: one sample a second for 2.9 days, 150 W throughout
    t0 = 1_700_000_000
    text = "".join(f"{t0 + i} {150.0 * i:.1f}\n" for i in range(lines))
    (tmp_path / runfiles.POWER).write_text(text)
    del text
    tracemalloc.start()
    try:
        out = jobpower._measured(tmp_path, t0 + 10, t0 + lines - 10)
        _, peak_b = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 0 < len(out) <= jobpower.MAX_POINTS
    assert all(abs(w - 150.0) < 1e-6 for _, w in out)
    assert out[0][0] <= t0 + 10 and out[-1][0] > t0 + lines - 1000  # the whole run
    assert peak_b < 24 << 20, peak_b  # ~15 MiB (a chunk); every sample held: ~52 MiB
    kept = jobpower.Thinned(t0, t0 + lines)
    for i in range(0, lines, 1000):
        kept.add([(t0 + j, 150.0 * j) for j in range(i, i + 1000)])
    assert kept.peak <= 2 * jobpower.MAX_POINTS + 1
    assert kept.points()[-1] == (t0 + lines - 1, 150.0 * (lines - 1))


# -- user text is drawn literally, and a figure that cannot be drawn is one line --------

HOSTILE = ["x$\\notacmd$", "cost $5 and $6", "$" + "{" * 200 + "x" + "}" * 200 + "$", "\x1b[2Jesc"]


def _literal(fig) -> None:
    """No text of ``fig`` is mathtext, none holds a control character."""
    from matplotlib.cbook import is_math_text

    texts = fig.findobj(lambda a: hasattr(a, "get_text"))
    for t in texts:
        assert not is_math_text(t.get_text()), t.get_text()
        assert "\x1b" not in t.get_text()


def _saved_quietly(build, tmp_path) -> None:
    import warnings

    from orchestrator.accounting.plots import save

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = build()
        save(fig, tmp_path / "x.png")
    assert (tmp_path / "x.png").read_bytes()[:8] == PNG
    assert not [w for w in caught if "Glyph" in str(w.message)], caught
    _literal(fig)


def test_report_plot_draws_hostile_users_and_labels_literally(tmp_path):
    from orchestrator.accounting.plots import report_figure

    row = {"carbon_kg": 1.0, "carbon_at_submission_kg": 2.0}
    data = {
        "by_user": {name: row for name in HOSTILE},
        "by_label": {name: row for name in HOSTILE},
        "total": {
            "jobs": 4,
            "saving_pct": 50.0,
            "carbon_kg": 4.0,
            "carbon_at_submission_kg": 8.0,
        },
        "signal": "csv:/tmp/$x$.csv",
        "first_submitted_at": "2026-11-20T10:00:00+00:00",
        "last_finished_at": "2026-11-21T10:00:00+00:00",
    }
    _saved_quietly(lambda: report_figure(data), tmp_path)
    ticks = [t.get_text() for t in report_figure(data).axes[0].get_xticklabels()]
    assert "cost \\$5 and \\$6" in ticks and "\\x1b[2Jesc" in ticks  # drawn as typed


def test_report_plot_draws_other_users_jobs_as_one_bar_beside_a_label_named_alike():
    from orchestrator.accounting.plots import report_figure

    row = {"carbon_kg": 1.0, "carbon_at_submission_kg": 2.0}
    data = {
        "by_user": {"alice": row, "bob": row},
        "by_label": {"(other users)": row, "-": row},  # bob's own label, named alike
        "others_labels_hidden": row | {"carbon_kg": 3.0},
        "total": {"jobs": 3, "saving_pct": None, "carbon_kg": 5.0,
                  "carbon_at_submission_kg": 6.0},
        "signal": None, "first_submitted_at": None, "last_finished_at": None,
    }  # fmt: skip
    labels = report_figure(data).axes[1]
    ticks = [t.get_text() for t in labels.get_xticklabels()]
    # two bars, neither lost, and bob's label is told from the other users' row
    assert ticks == ['"(other users)"', "-", "(other users)"]
    assert sorted(b.get_height() for b in labels.patches)[-1] == 3.0


@pytest.mark.parametrize("name", HOSTILE)
def test_job_plot_draws_a_hostile_name_literally(name, tmp_path):
    from orchestrator.accounting.plots import job_figure

    t0 = 1_700_000_000.0
    data = {
        "job": 3, "name": name, "state": "completed", "events": [],
        "runs": [{"attempt": 1, "start_s": t0, "end_s": t0 + 60, "modelled_w": 100.0,
                  "samples": [], "gpus": 1, "cap": None, "state": "exited",
                  "energy_modelled": True}],
        "carbon": {"source": "csv:$a$", "zone": "$DE$", "unit": "g/kWh", "start_s": t0,
                   "step_s": 900.0, "values": [100.0, 120.0]},
    }  # fmt: skip
    _saved_quietly(lambda: job_figure(data), tmp_path)


def test_a_figure_that_cannot_be_drawn_is_one_line(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from orchestrator.accounting.plots import save
    from orchestrator.errors import SpecError

    fig = Figure()

    def deep(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded\nwhile drawing")

    monkeypatch.setattr(fig, "savefig", deep)
    with pytest.raises(SpecError) as err:
        save(fig, tmp_path / "x.png")
    assert (
        str(err.value) == "cannot draw the plot: RecursionError: maximum recursion depth exceeded"
    )
    with pytest.raises(SpecError, match="format 'xyz' unknown"):
        save(Figure(), tmp_path / "x.xyz")
    with pytest.raises(SpecError, match="cannot write the plot"):
        save(Figure(), tmp_path / "missing" / "x.png")


def test_simulate_plots_draw_the_scenario_name_literally(outcome, tmp_path):
    import dataclasses

    scenario = outcome.inputs.scenario.model_copy(update={"name": "cost $5 and $\\notacmd$"})
    inputs = dataclasses.replace(outcome.inputs, scenario=scenario)
    hostile = dataclasses.replace(outcome, inputs=inputs)
    for fig in figures(hostile).values():
        _literal(fig)
        assert "cost \\$5 and \\$\\notacmd\\$" in _texts(fig)
    paths = write_plots(hostile, tmp_path)
    assert all(p.read_bytes()[:8] == PNG for p in paths)


def test_show_and_report_plot_a_hostile_name_and_label(cli, tmp_path):
    """Run by the CLI: exit 0, a PNG each, nothing on stderr (no glyph warning)."""
    cli.env["GRIDSHIFT_FAKE_GPU_POWER_W"] = "300"
    job_id = cli.submit("--now", "--name", "\x1b]0;$\\notacmd$", "--label", "x$\\notacmd$",
                        "--", "sleep", "0.2")  # fmt: skip
    cli.run_until_idle()
    shown = cli.run("show", str(job_id), "--plot", str(tmp_path / "job.png"))
    made = cli.run("report", "--plot", str(tmp_path / "report.png"))
    for proc, png in ((shown, "job.png"), (made, "report.png")):
        assert (tmp_path / png).read_bytes()[:8] == PNG, proc.stderr
        assert proc.stderr == "", proc.stderr


def test_report_text_tells_a_label_named_as_a_row_of_its_own_from_that_row(capsys):
    """A label literally named ``(other users)`` or ``total`` (a careless user's, or one
    meant to mislead whoever reads the report) is shown quoted: the row of other users'
    jobs and the total stay the only rows so named."""
    from orchestrator.cli.accounts import _print_report

    row = {"jobs": 1, "energy_kwh": 1.0, "modelled_jobs": 0, "carbon_kg": 1.0, "cost": None,
           "carbon_at_submission_kg": 2.0, "saving_pct": 50.0}  # fmt: skip
    data = {
        "by_user": {"bob": row},
        "by_label": {"(other users)": row, "total": row, "-": row},
        "others_labels_hidden": row | {"jobs": 7},
        "total": row | {"jobs": 9},
        "signal": None,
    }
    _print_report(data, None)
    rows = capsys.readouterr().out.split("by label")[1].splitlines()
    firsts = [line.split("  ")[0].strip() for line in rows if line.strip()]
    assert firsts.count("(other users)") == 1 and firsts.count("total") == 1
    assert '"(other users)"' in firsts and '"total"' in firsts
    (others,) = [line for line in rows if line.startswith("(other users)")]
    assert others.split()[2] == "7"
