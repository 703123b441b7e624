"""Co-location on the live daemon: two --share jobs on one fake GPU, both accounted; a job
that did not ask is never joined; bad --share inputs."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest

POWER_W = 200.0  # each fake GPU's draw
NODE = '[[nodes]]\nname = "box"\nexecutor = "local"\nfake_gpus = 1\nshare = "{share}"\n'
# a pair the model predicts with no slowdown on a V100 (the fake GPUs' fallback)
FIRST, SECOND = "ResNet-18 (batch size 16)", "ResNet-18 (batch size 64)"


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _setup(cli, share: str = "time-slice") -> None:
    cli.home.joinpath("gridshift.toml").write_text(NODE.format(share=share))
    cli.env.update(
        {"GRIDSHIFT_FAKE_GPU_POWER_W": str(POWER_W), "GRIDSHIFT_DAEMON__POWER_SAMPLE": "0.2s"}
    )


def _job(cli, tmp_path, name: str, seconds: float, *flags: str) -> int:
    out = tmp_path / f"{name.split()[0]}-{time.monotonic_ns()}.env"
    script = f'echo "$CUDA_VISIBLE_DEVICES" > {out}; sleep {seconds}'
    return cli.submit("--name", name, *flags, "--", "sh", "-c", script)


def test_two_sharing_jobs_run_on_one_gpu_and_split_its_energy(cli, tmp_path):
    _setup(cli)
    a = _job(cli, tmp_path, FIRST, 2.5, "--share")
    b = _job(cli, tmp_path, SECOND, 2.5, "--share")
    cli.run_until_idle(timeout=90)
    ja, jb = cli.json("show", str(a)), cli.json("show", str(b))
    assert ja["state"] == jb["state"] == "completed"
    (ra,), (rb,) = ja["runs"], jb["runs"]
    assert ra["node"] == rb["node"] == "box" and ra["gpu_ids"] == rb["gpu_ids"] == [0]
    seen = {p.read_text().strip() for p in tmp_path.glob("*.env")}
    assert seen == {"0"}, "one CUDA_VISIBLE_DEVICES for both"
    starts = [_ts(r["started_at"]) for r in (ra, rb)]
    ends = [_ts(r["finished_at"]) for r in (ra, rb)]
    assert max(starts) < min(ends), "they ran at the same time"
    # each is charged its part of the GPU's energy: together, the GPU's, never twice
    for r in (ra, rb):
        assert r["energy_kwh"] > 0 and r["energy_modelled"] is False
    total_j = (ra["energy_kwh"] + rb["energy_kwh"]) * 3.6e6
    gpu_j = POWER_W * (max(ends) - min(starts))
    assert total_j == pytest.approx(gpu_j, rel=0.05)
    alone_j = POWER_W * sum(e - s for s, e in zip(starts, ends, strict=True))
    assert total_j < 0.8 * alone_j


@pytest.mark.backends("sqlite")  # the same queries as above
def test_a_job_that_did_not_ask_is_never_joined(cli, tmp_path):
    _setup(cli)
    a = _job(cli, tmp_path, FIRST, 1.5)  # no --share: its GPU is its own
    b = _job(cli, tmp_path, SECOND, 0.5, "--share")
    cli.run_until_idle(timeout=90)
    (ra,), (rb,) = cli.json("show", str(a))["runs"], cli.json("show", str(b))["runs"]
    assert _ts(rb["started_at"]) >= _ts(ra["finished_at"]) - 0.05, "it waited for the GPU"


@pytest.mark.backends("sqlite")
def test_a_node_that_never_shares_runs_one_job_per_gpu(cli, tmp_path):
    _setup(cli, share="never")
    a = _job(cli, tmp_path, FIRST, 1.5, "--share")
    b = _job(cli, tmp_path, SECOND, 0.5, "--share")
    cli.run_until_idle(timeout=90)
    (ra,), (rb,) = cli.json("show", str(a))["runs"], cli.json("show", str(b))["runs"]
    assert _ts(rb["started_at"]) >= _ts(ra["finished_at"]) - 0.05


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize("line", ['{"command": ["true"], "share": "yes"}',
                                  '{"command": ["true"], "share": 1}'])  # fmt: skip
def test_bad_share_in_a_sweep_file(cli, tmp_path, line):
    sweep = tmp_path / "sweep.jsonl"
    sweep.write_text(line + "\n")
    proc = cli.run("submit", "--file", str(sweep), check=False)
    assert proc.returncode == 2 and "share" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert cli.job_count() == 0, "nothing half-written"


@pytest.mark.backends("sqlite")
def test_submit_says_when_a_share_job_will_run_alone_all_the_same(cli):
    """QA: --share on a cluster where no server shares, or on two GPUs, said nothing."""
    alone = "runs alone all the same: no server here shares GPUs (a [[nodes]] table's share)"
    for share, flags, said in (
        ("never", (), alone),
        ("time-slice", ("--gpus", "2"), "runs alone all the same: only one-GPU jobs share a GPU"),
        ("time-slice", (), None),
    ):
        node = NODE.format(share=share).replace("fake_gpus = 1", "fake_gpus = 2")
        cli.home.joinpath("gridshift.toml").write_text(node)
        proc = cli.run("submit", "--share", *flags, "--", "true")
        assert (said in proc.stderr) if said else ("runs alone" not in proc.stderr), proc.stderr
        assert (
            said is None
            or said
            in json.loads(cli.run("submit", "--json", "--share", *flags, "--", "true").stdout)[
                "outlook"
            ]
        )
    proc = cli.run("submit", "--", "true")  # did not ask: no word on sharing
    assert "share" not in proc.stderr


def test_bad_share_option_and_node_policy(cli):
    proc = cli.run("submit", "--share=sometimes", "--", "true", check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    cli.home.joinpath("gridshift.toml").write_text(NODE.format(share="always"))
    proc = cli.run("nodes", check=False)
    assert proc.returncode == 2 and "share" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    bad_users = NODE.format(share="time-slice") + 'share_users = "everyone"\n'
    cli.home.joinpath("gridshift.toml").write_text(bad_users)
    proc = cli.run("nodes", check=False)
    assert proc.returncode == 2 and "share_users" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.backends("sqlite")
def test_submit_share_is_stored_and_shown(cli):
    job = cli.submit("--share", "--", "true")
    assert cli.json("show", str(job))["share"] is True
    assert (
        json.loads(cli.run("show", "--json", str(cli.submit("--", "true"))).stdout)["share"]
        is False
    )


def test_progress_reports_give_a_speed_next_to_a_partner():
    from orchestrator.daemon.energy.sharing import SpeedTracker

    tracker = SpeedTracker()
    assert tracker.sample(1, 10.0, 0.1, None) is None
    assert tracker.sample(1, 20.0, 0.2, None) is None  # alone: 0.01 per s
    assert tracker.sample(1, 30.0, 0.25, "LM") is None  # the company changed: no rate yet
    assert tracker.sample(1, 40.0, 0.33, "LM") == pytest.approx(0.8)
    # untrusted reports: dated back, going backwards, or repeated give nothing
    assert tracker.sample(1, 35.0, 0.9, "LM") is None
    assert tracker.sample(1, 50.0, 0.2, "LM") is None
    assert tracker.sample(1, 50.0, 0.3, "LM") is None


def _placement(policy: str, host_uid: int = 1000, users: str = "same"):
    from types import SimpleNamespace

    from orchestrator.daemon.energy.sharing import Sharing

    config = SimpleNamespace(share=policy, share_users=users)
    node = SimpleNamespace(name="box", executor="local", config=config,
                           model_of=lambda gpus: "Tesla V100-SXM2")  # fmt: skip
    host = SimpleNamespace(name=SECOND, uid=host_uid, share=True, deadline=None, duration_s=None)
    att = SimpleNamespace(id=1, node="box", gpu_ids=[0], started_at=None, cap=None)

    class Stub(Sharing):
        def _alone(self, nodes):
            return [(att, host)]

    return Stub(db=None, nodes=[node])


def _asking(**kw):
    from types import SimpleNamespace

    fields = {"id": 9, "name": FIRST, "uid": 1000, "share": True, "attempts": 0,
              "deadline": None, "duration_s": None, "gpu_type": None, **kw}  # fmt: skip
    return SimpleNamespace(**fields)


def test_placement_rules_mps_is_one_users_and_nothing_is_forced():
    assert _placement("time-slice").place(_asking(), 1, 0.0) == ("box", [0])
    assert _placement("mps").place(_asking(), 1, 0.0) == ("box", [0])  # the same user
    assert _placement("mps", host_uid=0).place(_asking(), 1, 0.0) is None  # root's: no
    assert _placement("mps", host_uid=1001).place(_asking(), 1, 0.0) is None
    assert _placement("never").place(_asking(), 1, 0.0) is None
    # two users' jobs pair only where the node's (root-owned) config says any, time-slice
    assert _placement("time-slice", host_uid=1001).place(_asking(), 1, 0.0) is None
    assert _placement("time-slice", 1001, "any").place(_asking(), 1, 0.0) == ("box", [0])
    assert _placement("mps", host_uid=1001, users="any").place(_asking(), 1, 0.0) is None
    stub = _placement("time-slice")
    for job, width in [
        (_asking(share=False), 1),  # it did not ask
        (_asking(), 2),  # one GPU only
        (_asking(attempts=1), 1),  # a restart keeps its own GPU
        (_asking(gpu_type="p100"), 1),  # it asked for another type
        (_asking(deadline=datetime.fromtimestamp(10.0)), 1),  # a deadline, no duration
        (None, 1),
    ]:
        assert stub.place(job, width, 0.0) is None
    first = stub.place(_asking(id=1), 1, 5.0)
    assert first == ("box", [0]) and stub.shares(1)
    assert stub.place(_asking(id=2), 1, 5.0) is None  # one partner per GPU in a pass


def test_a_shared_gpu_counts_once_in_status_and_shows_both_jobs_in_nodes(cli, tmp_path):
    """Two jobs on one GPU of a two-GPU node, a third alone on the other: 2 GPUs held,
    not 3; ``nodes`` names both jobs on the shared GPU."""
    cli.home.joinpath("gridshift.toml").write_text(
        NODE.format(share="time-slice").replace("fake_gpus = 1", "fake_gpus = 2")
    )
    cli.env.update({"GRIDSHIFT_FAKE_GPU_POWER_W": str(POWER_W)})
    a = _job(cli, tmp_path, FIRST, 30, "--share")
    x = _job(cli, tmp_path, "x", 30)
    b = _job(cli, tmp_path, SECOND, 30, "--share")
    cli.daemon("--interval", "0.2")
    for job in (a, x, b):
        cli.wait_state(job, {"running"}, timeout=30)
    deadline = time.monotonic() + 10
    while (status := cli.json("status"))["running_jobs"] < 3 and time.monotonic() < deadline:
        time.sleep(0.3)  # the daemon writes its health at most once a second
    assert status["running_jobs"] == 3 and status["running_gpus"] == 2
    assert "3 running on 2 GPUs" in cli.run("status").stdout
    (node,) = cli.json("nodes")
    assert node["gpus_busy"] == 2 and node["gpus_free"] == 0
    shared, alone = sorted(node["gpu_list"], key=lambda g: len(g["job_ids"]), reverse=True)
    assert shared["job_ids"] == [a, b] and shared["job_id"] == a, "the first to hold it"
    assert alone["job_ids"] == [x] and alone["job_id"] == x
    jobs_column = cli.run("nodes").stdout.splitlines()[1].split()[-1]
    assert sorted(map(int, jobs_column.split(","))) == sorted([a, b, x])
