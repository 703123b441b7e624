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
        assert f"{name}: {len(due)}" in [t.get_text() for t in misses_ax.texts]
        assert len(misses_ax.collections[row].get_offsets()) == len(due)
    assert total > 0  # the scenario is tight enough to miss some
    bar_ax = figs["carbon_vs_jct"].axes[2]
    assert "deadline misses" in bar_ax.get_ylabel()
    heights = [p.get_height() for p in bar_ax.patches]
    assert heights == [outcome.results[n]["deadline_misses"] for n in outcome.results]
