"""The what-if simulator end to end: the engine's invariants on synthetic data, the
``gridshift simulate`` command (table, JSON, plots, flags, bad input), and runs on the
real traces when the shared data are present."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from orchestrator.sim.runner import simulate
from orchestrator.sim.scenario import Scenario
from tests.conftest import ROOT, shared_data

DATA = shared_data()
# ``gridshift simulate`` never opens the queue's store: one backend is enough
pytestmark = pytest.mark.backends("sqlite")
KEYS = {
    "carbon_kg",
    "energy_kwh",
    "cost",
    "avg_jct_h",
    "p50_jct_h",
    "p95_jct_h",
    "avg_wait_h",
    "deadline_misses",
    "makespan_h",
    "gpu_util",
    "jobs",
}


def _scenario(gpus=64, interruptible=0.5, count=300, **extra) -> Scenario:
    return Scenario.model_validate(
        {
            "policies": ["fifo", "lowest-window", "lowest-slots"],
            "jobs": {"source": f"synthetic:count={count}&days=7", "interruptible": interruptible},
            "grid": {"source": "synthetic:days=14", "price": "synthetic:quantity=price&days=14"},
            "cluster": {"gpus": gpus},
            **extra,
        }
    )


def _max_busy_gpus(run) -> float:
    times = np.concatenate((run.seg_start_s, run.seg_end_s))
    delta = np.concatenate((run.seg_gpus, -run.seg_gpus))
    order = np.lexsort((delta, times))  # ends before starts at the same time
    return float(np.cumsum(delta[order]).max())


def test_policies_do_the_same_work_and_carbon_aware_ones_emit_less():
    outcome = simulate(_scenario(gpus=4096), ROOT)  # no contention: each job is on its own
    fifo, window, slots = (outcome.results[p] for p in ("fifo", "lowest-window", "lowest-slots"))
    for m in (fifo, window, slots):
        assert set(m) >= KEYS and m["jobs"] == 300
        assert m["deadline_misses"] == 0
    assert window["energy_kwh"] == pytest.approx(fifo["energy_kwh"])  # same work, full power
    # the same work, and each restart's checkpoint cost of run (300 s at full power)
    assert fifo["energy_kwh"] < slots["energy_kwh"] < fifo["energy_kwh"] * 1.05
    assert window["carbon_kg"] < fifo["carbon_kg"]
    assert slots["carbon_kg"] <= window["carbon_kg"] + 1e-6
    assert slots["suspensions"] > 0 and window["suspensions"] == 0
    assert fifo["avg_wait_h"] == 0 and window["avg_wait_h"] > 0
    assert fifo["cost"] is not None and fifo["cost"] > 0
    runs = outcome.runs
    # each job individually: no later than its deadline, never started before submission
    inputs = outcome.inputs
    for run in runs.values():
        assert np.all(run.first_start_s >= inputs.jobs.submit_s)
        assert np.all(run.finish_s <= inputs.deadline_s + 1)


def test_a_small_cluster_is_never_oversubscribed_and_every_job_finishes():
    outcome = simulate(_scenario(gpus=16, count=200), ROOT)
    for name, run in outcome.runs.items():
        assert _max_busy_gpus(run) <= 16, name
        assert not np.isnan(run.finish_s).any()
        m = outcome.results[name]
        assert 0 < m["gpu_util"] <= 1
    assert outcome.results["fifo"]["avg_wait_h"] > 0  # it is busy enough to queue


def test_runs_are_reproducible_and_seeds_matter():
    a = simulate(_scenario(count=100, forecast="noise:0.2"), ROOT).results
    b = simulate(_scenario(count=100, forecast="noise:0.2"), ROOT).results
    c = simulate(_scenario(count=100, forecast="noise:0.2", seed=3), ROOT).results
    assert a == b  # every key, timings none: a what-if's output holds no wall-clock figure
    assert a != c


# -- the command ------------------------------------------------------------------------------
def test_simulate_example_prints_a_table_and_json(cli):
    example = str(ROOT / "examples" / "whatif.toml")
    # the table's rendering on the example's first 60 jobs; its figures on all 600 below
    table = cli.run("simulate", example, "--max-jobs", "60").stdout
    assert "lowest-window" in table and "vs fifo" in table and "%" in table
    data = cli.json("simulate", example)
    assert set(data) == {"scenario", "policies"}
    assert list(data["policies"]) == ["fifo", "lowest-window", "lowest-slots", "budget"]
    for metrics in data["policies"].values():
        assert set(metrics) >= KEYS
    carbon = {p: m["carbon_kg"] for p, m in data["policies"].items()}
    assert carbon["budget"] < carbon["lowest-slots"] < carbon["fifo"]  # caps as well as shifts
    assert data["policies"]["budget"]["deadline_misses"] == 0
    assert data["scenario"]["gpus"] == 32 and data["scenario"]["jobs"] == 600


def test_simulate_flags_without_a_file_and_plots(cli, tmp_path):
    trace = tmp_path / "jobs.jsonl"
    trace.write_text(
        "\n".join(
            json.dumps({"submit": f"2023-03-0{d}T10:00:00", "duration": "3h", "gpus": 2})
            for d in range(1, 6)
        )
        + "\n"
    )
    signal = tmp_path / "ci.csv"
    hours = np.arange(24 * 14)
    values = 300 + 100 * np.cos(2 * np.pi * hours / 24)
    signal.write_text(
        "Time,Carbon Intensity\n"
        + "".join(
            f"2023-03-01 {h % 24:02d}:00:00,{v}\n".replace(
                "2023-03-01", f"2023-03-{1 + h // 24:02d}"
            )
            for h, v in zip(hours, values, strict=True)
        )
    )
    data = cli.json(
        "simulate",
        "--jobs",
        str(trace),
        "--grid",
        f"csv:{signal}",
        "--gpus",
        "4",
        "--policy",
        "lowest-window",
        "--max-jobs",
        "3",
        "--deadline-rule",
        "within:12h",
        "--plot",
        str(tmp_path / "plots"),
    )
    assert list(data["policies"]) == ["fifo", "lowest-window"]  # fifo: the baseline
    assert data["policies"]["lowest-window"]["jobs"] == 3
    assert data["policies"]["lowest-window"]["carbon_kg"] < data["policies"]["fifo"]["carbon_kg"]
    for name in ("carbon_power.png", "carbon_vs_jct.png"):
        png = tmp_path / "plots" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope.toml"], "no such scenario file"),
        (["--policy", "greenest"], "unknown policy"),
        (["--forecast", "crystal"], "unknown forecast"),
        (["--deadline-rule", "someday"], "unknown deadline rule"),
        (["--grid", "csv:/no/such.csv"], "no such file"),
        (["--jobs", "/no/such.csv"], "no such job trace"),
        (["--interruptible", "2"], "--interruptible"),
        (["--gpus", "8", "--cluster", "c.toml"], "not both"),
        (["--jobs", "synthetic:count=-1"], "count"),
        (["--budget", "lots"], "invalid budget"),
        (["--objective", "speed"], "unknown objective"),
        (["--objective", "cost"], "needs a price signal"),
        (["--elastic", "1.5"], "--elastic"),
        (["--slot", "soon"], "invalid duration"),
    ],
)
def test_simulate_bad_input_gets_one_line_and_exit_2(cli, args, message):
    proc = cli.run("simulate", *args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_simulate_bad_scenario_files(cli, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    proc = cli.run("simulate", str(bad), check=False)
    assert proc.returncode == 2 and "invalid TOML" in proc.stderr
    bad.write_text("[cluster]\ngpus = 0\n")
    proc = cli.run("simulate", str(bad), check=False)
    assert proc.returncode == 2 and "cluster.gpus" in proc.stderr
    bad.write_text('colour = "red"\n')
    proc = cli.run("simulate", str(bad), check=False)
    assert proc.returncode == 2 and "colour" in proc.stderr


def test_a_bad_flag_is_blamed_on_the_flag_and_a_bad_key_on_its_file(cli, tmp_path):
    """With a scenario file, a flag's bad value names the flag, not the file; the file's
    own bad key names the file and the key; neither says pydantic's "Value error,"."""
    scenario = tmp_path / "s.toml"
    scenario.write_text('[jobs]\nmoves = "sometimes"\n')
    proc = cli.run("simulate", str(ROOT / "examples" / "whatif.toml"), "--backfill", "eager",
                   "--power-limit", "5kW", check=False)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("gridshift: error: --backfill: unknown backfill 'eager'; "
                                   "use easy, conservative or strict")  # fmt: skip
    proc = cli.run("simulate", str(scenario), check=False)
    assert proc.returncode == 2 and "Value error" not in proc.stderr
    assert proc.stderr.strip() == (f"gridshift: error: {scenario}: jobs.moves: moves is true, "
                                   'false, "empty-servers" or "waiting-jobs"')  # fmt: skip


def test_cluster_file_with_nodes(cli, tmp_path):
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(
        '[[nodes]]\nname = "a"\ngpus = 4\nrack = "r1"\n'
        '[[nodes]]\nname = "b"\ngpus = 2\nrack = "r1"\n'
        '[cluster]\ngpu = "a40"\npue = 1.3\n'
    )
    data = cli.json("simulate", "--jobs", "synthetic:count=40&days=2", "--cluster", str(cluster))
    assert data["scenario"]["gpus"] == 6


def test_a_cluster_takes_the_pue_a_daemon_takes(tmp_path):
    """The simulator's bound on PUE was 3 and the daemon's 5: a lab's config that the daemon
    runs with could not be replayed."""
    from orchestrator.sim.scenario import load_cluster_file

    path = tmp_path / "c.toml"
    path.write_text("[cluster]\npue = 4.0\n")
    assert load_cluster_file(path).pue == 4.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cluster = 5\n", "[cluster] must be a table"),
        ('cluster = "v100"\n', "[cluster] must be a table"),
        ("cluster = [1, 2]\n", "[cluster] must be a table"),
        ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
        ("[cluster]\nnode_idle_w = true\n", "node_idle_w"),
        ("[cluster]\npue = true\n", "pue"),
        ("[cluster]\npue = 5.5\n", "pue"),  # above the daemon's bound too
        ('[[nodes]]\nname = "a"\ngpus = 2\ngpu_idle_w = true\n', "nodes.0.gpu_idle_w"),
    ],
)
def test_bad_cluster_files_are_one_spec_error(tmp_path, text, message):
    from orchestrator.errors import SpecError
    from orchestrator.sim.scenario import load_cluster_file

    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(SpecError, match=re.escape(message)):
        load_cluster_file(path)


NODE = '[[nodes]]\nname = "a"\ngpus = 8\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # an empty node list was the default cluster (64 GPUs), with no word
        ("nodes = []\n", ": nodes: give at least one node"),
        ("[cluster]\nnodes = []\n", ": nodes: give at least one node"),
        # a node without GPUs left an empty cluster, then blamed a job for asking for 0
        ('[[nodes]]\nname = "a"\ngpus = 0\n', ": nodes.0.gpus: "),
        ('[[nodes]]\nname = "a"\nfake_gpus = 0\n', ": nodes.0.fake_gpus: "),
        ('[[nodes]]\nname = "a"\ngpus = -1\n', ": nodes.0.gpus: "),
        ('[[nodes]]\nname = "a"\nnvlink_islands = [[]]\n', "cluster: no node has a GPU"),
        # a typo was ignored: right-sizing silently off
        (NODE + 'idle_of_after = "1m"\n', ": nodes.0.idle_of_after: Extra inputs"),
        (NODE + '[[nodes]]\nname = "b"\ngpus = 8\nbogus = 1\n', ": nodes.1.bogus: Extra"),
        ("bogus = 1\n" + NODE, ": bogus: not a key of a cluster file"),
        ("[clustr]\ngpus = 8\n" + NODE, ": clustr: not a key of a cluster file"),
        ("[cluster]\ngpus = 8\nbogus = 1\n", ": bogus: Extra inputs"),
    ],
)
def test_bad_cluster_files_get_one_line_and_exit_2(cli, tmp_path, text, message):
    path = tmp_path / "c.toml"
    path.write_text(text)
    args = ("simulate", "--jobs", "synthetic:count=5&days=1", "--cluster", str(path))
    proc = cli.run(*args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[cluster]\nnodes = []\n", ": cluster.nodes: give at least one node"),
        ('[[cluster.nodes]]\nname = "a"\ngpus = 0\n', ": cluster.nodes.0.gpus: "),
        (
            '[[cluster.nodes]]\nname = "a"\ngpus = 8\nidle_of_after = "1m"\n',
            ": cluster.nodes.0.idle_of_after: Extra inputs",
        ),
        # the daemon's [[nodes]] refuses it too (QA: 2,000 W there, 10,000 W here)
        ('[[cluster.nodes]]\nname = "a"\ngpus = 8\ngpu_idle_w = 5000\n', "gpu_idle_w: "),
        ("[cluster]\ngpu_idle_w = 2500\n", ": cluster.gpu_idle_w: "),
    ],
)
def test_bad_scenario_nodes_get_one_line_and_exit_2(cli, tmp_path, text, message):
    path = tmp_path / "s.toml"
    path.write_text('[jobs]\nsource = "synthetic:count=5&days=1"\n' + text)
    proc = cli.run("simulate", str(path), check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_gridshift_toml_is_still_a_cluster_file(tmp_path):
    """A cluster file may be a daemon's gridshift.toml: its other sections and its nodes'
    daemon keys (SSH, Slurm, power commands) are taken and left aside."""
    from orchestrator.sim.inputs import build_topology
    from orchestrator.sim.scenario import load_cluster_file

    example = load_cluster_file(ROOT / "configs" / "gridshift.example.toml")
    assert [n.name for n in example.nodes] == ["gpu-box-1"]
    path = tmp_path / "gridshift.toml"
    path.write_text(
        'home = "/tmp/x"\ncancel_grace_s = 5\n[daemon]\npolicy = "budget"\n[grid]\n'
        'source = ["uk"]\n[[nodes]]\nname = "a"\nexecutor = "ssh"\nhost = "a.lab"\n'
        'user = "{user}"\nport = 2222\ngpus = 4\nshare = "mps"\npue = 1.3\n'
        'idle_off_after = "30m"\npower_on = ["/bin/true"]\npower_off = ["/bin/true"]\n'
        'wake_timeout = "10m"\n[[nodes]]\nname = "b"\nexecutor = "slurm"\ngpus = 8\n'
        'partition = "gpu"\nsbatch_args = ["--qos=green"]\ngpus_per_node = 4\n'
    )
    cluster = load_cluster_file(path)
    assert cluster.nodes[0].idle_off_after == "30m"
    assert sum(n.gpus for n in build_topology(cluster).nodes) == 12


# -- real traces -----------------------------------------------------------------------------
needs_data = pytest.mark.skipif(
    not (DATA / "jobs" / "philly.csv").is_file(), reason="shared data are absent"
)


@needs_data
def test_philly_on_germany_2023(cli):
    data = cli.json(
        "simulate",
        "--jobs",
        str(DATA / "jobs" / "philly.csv"),
        "--max-jobs",
        "1000",
        "--grid",
        f"csv:{DATA / 'grid/carbon/DE-LU/DE-LU_2023_hourly.csv'}",
        "--price",
        f"csv:{DATA / 'grid/prices/DE-LU/DE-LU_electricity_prices_2023.csv'}",
        "--gpus",
        "256",
        "--policy",
        "lowest-window",
    )
    assert data["scenario"]["start"].startswith("2023-")
    assert any("weeks" in note for note in data["scenario"]["notes"])
    fifo, window = data["policies"]["fifo"], data["policies"]["lowest-window"]
    assert fifo["jobs"] == window["jobs"] == 1000
    assert window["carbon_kg"] < fifo["carbon_kg"]
    assert data["scenario"]["price_unit"] == "USD"


@pytest.mark.skipif(
    not (DATA / "grid" / "lets-wait-awhile").is_dir(), reason="shared data are absent"
)
def test_lets_wait_awhile_semi_weekly_germany_within_one_point():
    import benchmarks.lets_wait_awhile as lwa

    submit, durations = lwa.study_jobs()
    folder = DATA / "grid" / "lets-wait-awhile"
    grid = f"csv:{folder / 'ger_ci.csv'}?resolution=30m"
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        jobs = Path(tmp) / "jobs.jsonl"
        lwa.write_jobs(jobs, submit, durations)
        base = lwa.carbon(grid, jobs, "none", "fifo", "perfect", 0)
        shifted = lwa.carbon(grid, jobs, "semi-weekly", "lowest-window", "perfect", 0)
    assert 100 * (1 - shifted / base) == pytest.approx(14.1, abs=1.0)


def test_a_running_jobs_later_pieces_hold_their_gpus_in_the_planners_view():
    # a job in the first of its planned pieces holds its GPUs in the later ones too: the
    # planner counted them only to the end of the piece it ran in, gave them away, and the
    # job found no room to resume (Philly 300 jobs on 64 GPUs: 71 misses that were 273)
    from executors.base import Handle
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.planning.policies.base import Decision, QueuedJob
    from orchestrator.sim.engine import SimDaemon, _Attempt
    from orchestrator.sim.inputs import prepare
    from orchestrator.sim.runner import make_forecaster

    scenario = _scenario(gpus=8, count=5)
    inputs = prepare(scenario, Path("."))
    sim = SimDaemon(inputs, resolve_policy("budget"), make_forecaster("perfect", inputs, 0))
    now = float(inputs.jobs.submit_s[0])
    pieces = ((now, now + 3600.0), (now + 7200.0, now + 9000.0), (now + 1e4, now + 2e4))
    decision = Decision(now, pieces, configs=((2, 1.0, 500.0), (2, 0.8, 400.0), (4, 1.0, 900.0)))
    job = QueuedJob(id=0, gpus=2, submitted_s=now, duration_s=1.4e4, interruptible=True)
    attempt = _Attempt(job, ("job", 0), Handle(1, ""), decision, None, 2, 500.0, now + 3600.0)
    sim._running[1] = attempt
    held = [(c.start_s - now, c.end_s - now, c.gpus, c.power_w)
            for c in sim._context(now + 60.0)["committed"]]  # fmt: skip
    assert held == [(60.0, 3600.0, 2, 500.0), (7200.0, 9000.0, 2, 400.0),
                    (1e4, 2e4, 4, 900.0)]  # fmt: skip


def test_a_dependant_is_planned_from_its_dependencys_last_piece():
    # planned ahead, a dependant starts no earlier than the end of its dependency's plan:
    # the end of the piece it runs in now let it start while the pieces after still held
    # the GPUs
    from executors.base import Handle
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.planning.policies.base import Decision, QueuedJob
    from orchestrator.sim.engine import SimDaemon, _Attempt
    from orchestrator.sim.inputs import prepare
    from orchestrator.sim.runner import make_forecaster

    inputs = prepare(_scenario(gpus=8, count=5), Path("."))
    sim = SimDaemon(inputs, resolve_policy("budget"), make_forecaster("perfect", inputs, 0))
    now = float(inputs.jobs.submit_s[0])
    pieces = ((now, now + 3600.0), (now + 7200.0, now + 9000.0))
    decision = Decision(now, pieces)
    job = QueuedJob(id=0, gpus=2, submitted_s=now, duration_s=5400.0, interruptible=True)
    sim._running[1] = _Attempt(job, ("job", 0), Handle(1, ""), decision, None, 2, 500.0,
                               now + 3600.0)  # fmt: skip
    sim._held = [1]
    sim._after = {1: [0]}
    _held, after, ends = sim._ahead(now + 60.0)
    assert after == {1: [0]} and ends == {0: now + 9000.0}
