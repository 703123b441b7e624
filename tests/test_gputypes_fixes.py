"""Mixed GPU types, after the review of issue 24's TYPES slice: backfill, the guard and
the re-pack across servers keep to a job's type; the simulator moves a job's run on a
cluster of one other type; cron and CSV traces check and read types as plain submits."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from orchestrator.errors import SpecError
from orchestrator.planning.backfill import CONSERVATIVE, EASY, Backfill, Cluster, job_key
from orchestrator.planning.policies.base import Decision, QueuedJob
from placement.cluster import ClusterAllocator
from placement.topology import ClusterTopology, NodeTopology


def _typed_cluster(*nodes: tuple[str, int, str]) -> ClusterAllocator:
    topo = ClusterTopology(tuple(NodeTopology.plain(n, g, "r", gpu=t) for n, g, t in nodes))
    return ClusterAllocator(topo)


@pytest.mark.parametrize("mode", [CONSERVATIVE, EASY])
def test_backfill_behind_a_typed_head_uses_the_other_types_gpus(mode):
    # 2 V100 + 2 P100; a job holds one P100 until t=100; the head asks for both P100s
    alloc = _typed_cluster(("v", 2, "v100"), ("p", 2, "p100"))
    alloc.hold("running", "p", [0])
    head = QueuedJob(1, 2, 0.0, duration_s=50.0, gpu_type="p100")
    rest = [QueuedJob(i, 1, float(i), duration_s=1000.0) for i in (2, 3, 4)]

    def allocate(job, decision):  # the allocator's best fit: the fullest node first
        return alloc.allocate(job_key(job.id), job.gpus, gpu_type=job.gpu_type)

    queue = [(job, Decision(0.0)) for job in [head, *rest]]
    started = Backfill(mode, 0.0, Cluster(alloc, {"running": 100.0}), allocate).fill(queue)
    # the untyped jobs take the V100s (refused on the free P100, tried again off it); the
    # P100 the head waits for stays free; before, the head "fitted" on the V100s and they
    # were kept from everyone
    assert [queue[i][0].id for i, _ in started] == [2, 3]
    assert {node for _, a in started for node, _ in a.parts} == {"v"}
    assert alloc.free_on("p") == [1]


@pytest.mark.parametrize("mode", [CONSERVATIVE, EASY])
def test_backfill_a_typed_job_wider_than_its_type_holds_nothing(mode):
    alloc = _typed_cluster(("v", 2, "v100"), ("p", 2, "p100"))
    alloc.hold("running", "v", [0, 1])
    head = QueuedJob(1, 4, 0.0, duration_s=50.0, gpu_type="p100")  # never: 2 P100s
    rest = QueuedJob(2, 1, 1.0, duration_s=1000.0)

    def allocate(job, decision):
        return alloc.allocate(job_key(job.id), job.gpus, gpu_type=job.gpu_type)

    backfill = Backfill(mode, 0.0, Cluster(alloc, {"running": 100.0}), allocate)
    # it never starts here (the daemon fails it, the simulator leaves it out): it keeps
    # no one waiting, and raises nothing
    assert len(backfill.fill([(head, Decision(0.0)), (rest, Decision(0.0))])) == 1


def _mixed_run(tmp_path, jobs: list[dict], nodes: list[dict], backfill=CONSERVATIVE, **cfg):
    from orchestrator.sim.runner import simulate
    from orchestrator.sim.scenario import Scenario

    trace = tmp_path / "jobs.jsonl"
    trace.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    scenario = Scenario.model_validate(
        {
            "policies": ["fifo"],
            "backfill": backfill,
            "jobs": {"source": str(trace), "deadline_rule": "none", "models": "none", **cfg},
            "grid": {"source": "synthetic:days=7"},
            "cluster": {"gpu": "v100", "nodes": nodes},
        }
    )
    outcome = simulate(scenario, tmp_path)
    return outcome.runs["fifo"], outcome.results["fifo"]


@pytest.mark.parametrize("mode", [CONSERVATIVE, EASY])
def test_sim_a_typed_head_starts_once_its_type_is_free(tmp_path, mode):
    nodes = [{"name": "v", "gpus": 4, "gpu": "v100"}, {"name": "p", "gpus": 4, "gpu": "p100"}]
    jobs = [
        {"submit": 0, "duration": 7200, "gpus": 1},  # on a P100 (the least energy)
        {"submit": 10, "duration": 3600, "gpus": 4, "gpu_type": "p100"},
        *({"submit": 60 + i, "duration": 36000, "gpus": 1} for i in range(6)),
    ]
    run, _ = _mixed_run(tmp_path, jobs, nodes, mode)
    start_h = (run.first_start_s - run.first_start_s.min()) / 3600
    # the typed job starts when the first job leaves the P100s (before: 21.2 h, the
    # 10 h jobs backfilled onto the P100s while V100s idled); the 10 h jobs take the V100s
    assert start_h[1] == pytest.approx(run.finish_s[0] / 3600 - run.first_start_s.min() / 3600)
    assert start_h[1] < 2.5
    assert (start_h[2:6] < 0.1).all()


def test_sim_a_cluster_of_one_other_type_runs_at_its_speed(tmp_path):
    job = {"submit": 0, "duration": 3600, "gpus": 1, "name": "ResNet-50"}
    run, _ = _mixed_run(tmp_path, [job], [{"name": "p", "gpus": 1, "gpu": "p100"}])
    # the trace's hour is on the cluster's default (V100); on its only P100s it runs at
    # Gavel's ResNet-50 ratio (before: one type = the reference, 1.0 h at V100 power)
    assert float(run.finish_s[0] - run.first_start_s[0]) == pytest.approx(3600 / 0.659)


def test_sim_guard_suspends_only_jobs_on_the_urgent_jobs_type(tmp_path):
    nodes = [{"name": "v", "gpus": 4, "gpu": "v100"}, {"name": "p", "gpus": 4, "gpu": "p100"}]
    urgent = {"submit": 60, "duration": 3600, "gpus": 4, "gpu_type": "p100", "within": "1h30m"}
    long = {"submit": 0, "duration": 36000, "gpus": 4, "interruptible": True}
    # only the V100 job may be suspended: suspending it would not help the P100 job
    jobs = [dict(long, gpu_type="v100"), dict(long, gpu_type="p100", interruptible=False), urgent]
    run, result = _mixed_run(tmp_path, jobs, nodes, interruptible=0.0)
    assert result["guard_suspensions"] == 0  # before: 8, the V100 job lost 8 checkpoints
    assert float(run.finish_s[0] - run.first_start_s[0]) == pytest.approx(36000)
    # both suspendable: the P100 one makes room, the V100 one runs on
    jobs[1]["interruptible"] = True
    run, result = _mixed_run(tmp_path, jobs, nodes, interruptible=0.0)
    assert result["guard_suspensions"] == 1 and result["deadline_misses"] == 0
    assert float(run.finish_s[0] - run.first_start_s[0]) == pytest.approx(36000)


def test_make_room_keeps_to_the_type():
    alloc = _typed_cluster(("v", 4, "v100"), ("p", 4, "p100"), ("p2", 4, "p100"))
    alloc.allocate("vjob", 4, gpu_type="v100")
    alloc.allocate("pjob", 4, gpu_type="p100")
    alloc.allocate("pjob2", 4, gpu_type="p100")
    assert alloc.make_room(4, ["vjob", "pjob"]) == ["vjob"]  # untyped: any is fine
    assert alloc.make_room(4, ["vjob", "pjob"], "p100") == ["pjob"]
    assert alloc.make_room(4, ["vjob"], "p100") is None
    assert alloc.make_room(8, ["vjob", "pjob"], "p100") is None  # p2 is pinned
    assert sorted(alloc.make_room(8, ["vjob", "pjob", "pjob2"], "p100")) == ["pjob", "pjob2"]


def test_across_servers_repack_keeps_the_type():
    from orchestrator.daemon.energy.across import across_servers
    from orchestrator.daemon.energy.gputypes import allocate_typed, with_types

    names = [("vlocal", "V100", "local"), ("p1", "P100", "ssh"), ("p2", "P100", "ssh")]
    names += [("v1", "V100", "ssh"), ("v2", "V100", "ssh")]
    nodes = [SimpleNamespace(name=n, gpu_model=f"Tesla {m}-16GB") for n, m, _ in names]
    topo = ClusterTopology(tuple(NodeTopology.plain(n.name, 4, rack="r") for n in nodes))
    alloc = ClusterAllocator(with_types(topo, nodes))
    view = QueuedJob(1, 8, 0.0, duration_s=3600.0, gpu_type="v100")
    job = SimpleNamespace(gpu_type="v100", name=None, gpus_min=8)
    first = allocate_typed(alloc, ("job", 1), 8, job, view, Decision(0.0), 0.0)
    assert "vlocal" in {node for node, _ in first.parts}  # not an SSH server: packed again
    ssh = {n for n, _, e in names if e == "ssh"}
    got = across_servers(alloc, ssh, ("job", 1), first.parts, 8, view.gpu_type)
    assert sorted(node for node, _ in got[2]) == ["v1", "v2"]  # before: p1, p2


CLUSTER = (
    '[[nodes]]\nname = "vbox"\nfake_gpus = 2\ngpu_model = "Tesla V100-SXM2-16GB"\n'
    '[[nodes]]\nname = "pbox"\nfake_gpus = 2\ngpu_model = "Tesla P100-PCIE-16GB"\n'
)


@pytest.mark.backends("sqlite")
def test_cron_refuses_a_type_no_node_has(cli):
    (cli.home / "gridshift.toml").write_text(CLUSTER)
    args = ("submit", "--cron", "* * * * *", "--window", "1h", "--gpu-type")
    proc = cli.run(*args, "a100", "--", "true", check=False)
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.strip().endswith("no node has GPU type a100 (this cluster's: p100, v100)")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "true" not in cli.run("cron", "ls").stdout  # nothing half-written
    assert cli.run(*args, "P100", "--", "true").returncode == 0


def test_csv_trace_with_some_rows_typed(tmp_path):
    from orchestrator.sim.traces import read_trace

    trace = tmp_path / "t.csv"
    trace.write_text("submit,duration,gpus,gpu_type,name\n0,60,1,p100,\n0,60,1,,b\n9,60,1,100,c\n")
    jobs = read_trace(trace)
    assert jobs.gpu_types == ("p100", None, "100") and jobs.names == ("", "b", "c")
    trace.write_text("submit,duration,gpu_type\n0,60,../x\n")
    with pytest.raises(SpecError, match=r"t\.csv job 1: invalid GPU type"):
        read_trace(trace)
    trace.write_text("submit,duration\n0,60\n")  # no gpu_type column: as before
    assert read_trace(trace).gpu_types in (None, (None,))


@pytest.mark.parametrize(
    "name, canonical",
    [
        ("Quadro P1000", "p1000"),  # before: p100
        ("NVIDIA RTX A4000", "a4000"),  # before: a40
        ("NVIDIA RTX 6000 Ada Generation", "rtx6000ada"),  # before: rtx6000
        ("Quadro GP100", "gp100"),
        ("xa100", "xa100"),  # a user's typo is no A100
        ("NVIDIA H100 80GB HBM3", "h100"),  # before: nvidia-h100-80gb-hbm3
        ("h100", "h100"),
        ("rtx-6000", "rtx6000"),  # before: a label rtx-6000
        ("rtx_6000", "rtx6000"),
        ("Quadro RTX 6000", "rtx6000"),
        ("NVIDIA A100-PCIE-40GB", "a100"),
        ("Tesla P100-PCIE-16GB", "p100"),
        ("NVIDIA A40", "a40"),
        ("Tesla K80", "k80"),
        ("!!!", None),
        ("NVIDIA", None),
    ],
)
def test_type_names_are_whole_words(name, canonical):
    from orchestrator.planning.devices.gputypes import type_of

    assert type_of(name) == canonical


def test_the_planners_a100_is_the_simulators_a100():
    from orchestrator.planning.devices import gputypes
    from orchestrator.planning.perfmodel import curve_for

    a100 = curve_for("NVIDIA A100-SXM4-40GB")
    # before: the generic curve at 300 W, named "generic", so the live daemon took an A100
    # first node's jobs as measured on a V100 (speed 1.0) and at the wrong power
    assert a100 == gputypes.curve("a100") and a100.gpu == "a100" and a100.max_limit_w == 400
    assert curve_for("Quadro P1000").gpu == "generic"  # before: the P100's fit
    assert curve_for("Tesla V100-SXM2-16GB").gpu == "v100"


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize("bad", ["nvidia", "Tesla-16GB"])  # "---": refused as before
def test_submit_refuses_a_gpu_type_that_names_no_gpu(cli, bad):
    (cli.home / "gridshift.toml").write_text(CLUSTER)
    proc = cli.run("submit", "--gpu-type", bad, "--", "true", check=False)
    assert proc.returncode == 2 and "names no GPU" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert cli.json("ls") in ([], {"jobs": []})  # nothing queued


@pytest.mark.backends("sqlite")
def test_submit_matches_whole_type_names(cli):
    (cli.home / "gridshift.toml").write_text(
        CLUSTER + '[[nodes]]\nname = "hbox"\nfake_gpus = 1\ngpu_model = "NVIDIA H100 80GB HBM3"\n'
    )
    for loose in ("p1000", "xv100"):  # before: taken for a P100 and a V100
        proc = cli.run("submit", "--gpu-type", loose, "--", "true", check=False)
        assert proc.returncode == 2 and f"no node has GPU type {loose}" in proc.stderr
    assert cli.run("submit", "--gpu-type", "H100", "--", "true").returncode == 0


@pytest.mark.backends("sqlite")  # simulate never opens the store
@pytest.mark.parametrize("gpu", ['"   "', '"!!!"'])
def test_simulate_refuses_a_gpu_type_that_names_no_gpu(cli, tmp_path, gpu):
    for text in (
        f"[cluster]\ngpu = {gpu}\n",
        f'[cluster]\nnodes = [{{name = "a", gpus = 4, gpu = {gpu}}}]\n',
    ):
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        proc = cli.run("simulate", str(bad), check=False)
        assert proc.returncode == 2 and "names no GPU" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_sim_notes_a_type_without_measurements(tmp_path):
    from orchestrator.sim.hardware.devices import note_unknown_types

    notes: list[str] = []
    topo = ClusterTopology(
        (NodeTopology.plain("a", 2, gpu="h100"), NodeTopology.plain("b", 2, gpu="v100"))
    )
    note_unknown_types(topo, notes)
    assert len(notes) == 1 and notes[0].startswith("GPU type(s) h100:")


@pytest.mark.backends("sqlite")
def test_show_says_the_type_a_job_asked_for(cli):
    (cli.home / "gridshift.toml").write_text(CLUSTER)
    typed = cli.submit("--gpu-type", "P100", "--", "true")
    plain = cli.submit("--", "true")
    assert any(
        line.split() == ["gpu", "type", "p100"]
        for line in cli.run("show", str(typed)).stdout.splitlines()
    )
    assert "gpu type" not in cli.run("show", str(plain)).stdout


def test_resize_probe_keeps_to_the_heads_type():
    from orchestrator.planning.resizestep import fits_after

    alloc = _typed_cluster(("v", 2, "v100"), ("p", 2, "p100"))
    alloc.allocate("pjob", 2, gpu_type="p100")
    assert fits_after(alloc, 2, {}) and not fits_after(alloc, 2, {}, "p100")
    assert fits_after(alloc, 2, {"pjob": 1}, "p100") is False  # 1 of 2 P100s left: no
    assert fits_after(alloc, 1, {"pjob": 1}, "p100")
    assert not fits_after(alloc, 3, {}, "p100")  # more than its type has: never, no error
    assert alloc.allocation("pjob").gpus == 2  # left as it was


def test_backfill_with_the_daemons_type_choice():
    # the live daemon's allocate (allocate_typed: the least-energy type with room) behind a
    # typed head, as the review's live run: 2 V100 + 2 P100, one P100 held for 6 s
    from orchestrator.daemon.energy.gputypes import allocate_typed

    alloc = _typed_cluster(("vbox", 2, "v100"), ("pbox", 2, "p100"))
    alloc.hold(job_key(1), "pbox", [0])
    head = QueuedJob(2, 2, 1.0, duration_s=2.0, gpu_type="p100")
    rest = [QueuedJob(i, 1, float(i), duration_s=12.0) for i in (3, 4, 5, 6)]

    def allocate(job, decision):
        row = SimpleNamespace(gpu_type=job.gpu_type, name=None, gpus_min=job.gpus)
        return allocate_typed(alloc, job_key(job.id), job.gpus, row, job, decision, 0.0)

    for mode in (CONSERVATIVE, EASY):
        queue = [(job, Decision(0.0)) for job in [head, *rest]]
        cluster = Cluster(alloc, {job_key(1): 6.0})
        started = Backfill(mode, 0.0, cluster, allocate).fill(queue)
        # two of them on the V100s now (before: none; the V100s idled for the whole run)
        assert [queue[i][0].id for i, _ in started] == [3, 4]
        assert {node for _, a in started for node, _ in a.parts} == {"vbox"}
        for i, _ in started:
            alloc.free(job_key(queue[i][0].id))


def test_speed_fit_states_its_out_of_sample_error():
    from orchestrator.planning.devices.gputypes import SPEEDS

    errors = json.loads(SPEEDS.read_text())["errors"]
    for gpu in ("p100", "k80"):  # leaving each job type out errs more than in sample
        e = errors[gpu]
        assert e["median_rel_err_family"] < e["median_rel_err_loo"] <= e["max_rel_err_loo"]
    assert errors["p100"]["median_rel_err_loo"] == pytest.approx(0.142, abs=1e-3)
    assert errors["k80"]["median_rel_err_loo"] == pytest.approx(0.188, abs=1e-3)


def test_profile_reserves_on_the_type_only():
    from orchestrator.planning.profile import Profile

    alloc = _typed_cluster(("v", 4, "v100"), ("p", 4, "p100"), ("p2", 4, "p100"))
    profile = Profile(alloc.topology, 0.0)
    profile.hold({1: 0b0011}, 50.0)  # half of p until t=50
    one = profile.reserve(2, 10.0, [], "p100")
    assert set(one.masks) <= {1, 2} and one.start_s == 0.0  # p2 is idle
    wide = profile.reserve(8, 10.0, [one], "p100")  # whole P100 nodes, after p frees up
    assert set(wide.masks) == {1, 2} and wide.start_s == 50.0
    assert set(profile.reserve(4, 10.0, [one, wide], "v100").masks) == {0}
    never = profile.reserve(4, 10.0, [], "k80")  # no such node: holds nothing
    assert never.masks == {} and never.start_s == 0.0
