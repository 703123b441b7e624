"""Mixed GPU types on the live daemon (fake GPUs with a model per node): submit
--gpu-type good and bad, jobs kept to their type, a free type chosen for the others."""

from __future__ import annotations

import json

import pytest

CLUSTER = (
    '[[nodes]]\nname = "vbox"\nfake_gpus = 2\ngpu_model = "Tesla V100-SXM2-16GB"\n'
    '[[nodes]]\nname = "pbox"\nfake_gpus = 2\ngpu_model = "Tesla P100-PCIE-16GB"\n'
)
NODE = {"v100": "vbox", "p100": "pbox"}
# the types are the daemon's logic, not the store's: one backend is enough
pytestmark = pytest.mark.backends("sqlite")


def test_the_daemon_keeps_jobs_to_their_gpu_type_and_chooses_for_the_others(cli):
    from orchestrator.planning.devices import gputypes
    from orchestrator.planning.perfmodel import JobModel

    (cli.home / "gridshift.toml").write_text(CLUSTER)
    model = JobModel(3600, 1, gputypes.curve("v100"))
    best = gputypes.choose_type(model, "any", "v100", ["v100", "p100"], 1, 1.0, 0)
    free = cli.submit("--within", "2h", "--", "true")  # no type: the least energy (in time)
    # two jobs for both P100s: the second waits for the first though V100s are free
    first = cli.submit("--now", "--gpus", "2", "--gpu-type", "p100", "--", "sleep", "1")
    second = cli.submit("--now", "--gpus", "2", "--gpu-type", "P100", "--", "true")
    on_v100 = cli.submit("--now", "--gpu-type", "v100", "--", "true")
    cli.run_until_idle()
    jobs = {i: cli.json("show", str(i)) for i in (free, first, second, on_v100)}
    assert all(j["state"] == "completed" for j in jobs.values()), jobs
    assert jobs[free]["node"] == NODE[best] and jobs[free]["gpu_type"] is None
    assert jobs[first]["node"] == jobs[second]["node"] == "pbox"
    assert jobs[second]["gpu_type"] == "p100" and jobs[on_v100]["node"] == "vbox"
    assert jobs[second]["started_at"] >= jobs[first]["finished_at"]
    said = cli.run("restart", str(second)).stdout  # a restart keeps the type it asked for
    copy = int(said.split()[1].rstrip(":"))
    assert cli.json("show", str(copy))["gpu_type"] == "p100"


def test_submit_refuses_a_bad_or_absent_gpu_type(cli, tmp_path):
    (cli.home / "gridshift.toml").write_text(CLUSTER)
    for value, message in [
        ("a100", "no node has GPU type a100 (this cluster's: p100, v100)"),
        ("../../etc", "invalid GPU type '../../etc'"),
        ("x" * 65, "invalid GPU type"),
    ]:
        proc = cli.run("submit", "--gpu-type", value, "--", "true", check=False)
        assert proc.returncode == 2 and message in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    sweep = tmp_path / "sweep.jsonl"  # a sweep's line says it too, and nothing is queued
    lines = [{"command": ["true"]}, {"command": ["true"], "gpu_type": "a100"}]
    sweep.write_text("".join(json.dumps(line) + "\n" for line in lines))
    proc = cli.run("submit", "--file", str(sweep), check=False)
    # the line, as a spec's own error names it (QA: the type's refusal had no file:line)
    assert proc.returncode == 2 and "sweep.jsonl:2: no node has GPU type a100" in proc.stderr
    sweep.write_text(json.dumps({"command": ["true"], "gpu_type": 7}) + "\n")
    proc = cli.run("submit", "--file", str(sweep), check=False)
    assert proc.returncode == 2 and "sweep.jsonl:1: invalid GPU type 7" in proc.stderr
    assert cli.job_count() == 0


def test_submit_refuses_a_job_wider_than_its_types_gpus(cli, tmp_path):
    """It could never start (planning would fail it): refused at submission, as a job
    wider than the largest node is, not queued with "starts when GPUs are free"."""
    big = '[[nodes]]\nname = "abox"\nfake_gpus = 4\ngpu_model = "NVIDIA A40"\n'
    (cli.home / "gridshift.toml").write_text(CLUSTER + big)  # the largest node has 4
    proc = cli.run("submit", "--gpus", "3", "--gpu-type", "v100", "--", "true", check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "needs 3 v100 GPUs; the cluster has 2" in proc.stderr
    sweep = tmp_path / "sweep.jsonl"
    lines = [{"command": ["true"], "gpu_type": "p100", "gpus": 2},
             {"command": ["true"], "gpu_type": "p100", "gpus": "4-8"}]  # fmt: skip
    sweep.write_text("".join(json.dumps(line) + "\n" for line in lines))
    proc = cli.run("submit", "--file", str(sweep), check=False)
    assert (
        proc.returncode == 2
        and "sweep.jsonl:2: needs 4 p100 GPUs; the cluster has 2" in proc.stderr
    )
    sweep.write_text(json.dumps({"command": ["true"], "gpus": 9}) + "\n")  # wider than any node
    proc = cli.run("submit", "--file", str(sweep), check=False)
    assert proc.returncode == 2 and "sweep.jsonl:1: needs 9 GPUs; the largest" in proc.stderr
    assert cli.job_count() == 0
    cli.submit("--gpus", "2-4", "--gpu-type", "v100", "--", "true")  # its minimum fits
    assert cli.job_count() == 1


def test_plan_keeps_a_wide_job_off_the_gpus_its_type_lacks(cli):
    """``gridshift plan`` on 2 V100s and 1 K80 (``planning.policies.tiers``): with a V100
    busy, a 2-GPU job (V100s only: one K80) is not planned now, as on the pool of 3."""
    from datetime import UTC, datetime

    from sqlalchemy import create_engine, text

    kbox = '[[nodes]]\nname = "kbox"\nfake_gpus = 1\ngpu_model = "Tesla K80"\n'
    (cli.home / "gridshift.toml").write_text(CLUSTER.split('[[nodes]]\nname = "pbox"')[0] + kbox)
    busy = cli.submit("--duration", "10h", "--within", "20h", "--", "true")
    wide = cli.submit("--gpus", "2", "--duration", "15m", "--within", "1h", "--", "true")
    engine = create_engine(cli.db_url)
    with engine.begin() as conn:  # the first job runs on a V100 (as the daemon records it)
        conn.execute(
            text("UPDATE job SET state = 'running', node = 'vbox', gpu_ids = '[0]', "
                 "started_at = :t WHERE id = :i"),
            {"t": datetime.now(UTC).replace(tzinfo=None), "i": busy},
        )  # fmt: skip
    engine.dispose()
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    rows = cli.json("plan", "--grid", f"synthetic:start={day}&days=3", "--policy", "budget")
    (row,) = [r for r in rows["jobs"] if r["id"] == wide]
    assert row["forced"] and row["start"] != rows["now"]


WIDE = CLUSTER + '[[nodes]]\nname = "abox"\nfake_gpus = 4\ngpu_model = "NVIDIA A40"\n'


def _refused(proc, message: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_edit_checks_the_width_and_type_as_submit_does(cli):
    """An edit the cluster's GPUs of the job's type could never hold is refused, as submit
    refuses it (before: accepted, and the daemon failed the job)."""
    (cli.home / "gridshift.toml").write_text(WIDE)  # the largest node has 4: 3 fits it
    job = str(cli.submit("--gpus", "1-4", "--gpu-type", "v100", "--", "true"))
    before = cli.json("show", job)
    _refused(
        cli.run("edit", job, "--gpus", "3", check=False), "needs 3 v100 GPUs; the cluster has 2"
    )
    _refused(cli.run("edit", job, "--gpu-type", "a100", check=False),
             "no node has GPU type a100 (this cluster's: a40, p100, v100)")  # fmt: skip
    _refused(cli.run("edit", job, "--gpu-type", "../../etc", check=False), "invalid GPU type")
    _refused(cli.run("edit", job, "--gpu-type", "nvidia", check=False), "names no GPU")
    _refused(cli.run("edit", job, "--gpus", "3", "--gpu-type", "P100", check=False),
             "needs 3 p100 GPUs; the cluster has 2")  # fmt: skip
    after = cli.json("show", job)
    assert (after["gpus_min"], after["gpus_max"], after["gpu_type"]) == (1, 4, "v100")
    assert after["events"] == before["events"]  # nothing written
    # what fits is changed: a type with room, and "" for any type (then 3 fits the A40s)
    cli.run("edit", job, "--gpu-type", "P100", "--gpus", "2")
    assert cli.json("show", job)["gpu_type"] == "p100"
    cli.run("edit", job, "--gpu-type", "", "--gpus", "3")  # any type: 3 fit the A40s
    _refused(
        cli.run("edit", job, "--gpu-type", "v100", check=False),
        "needs 3 v100 GPUs; the cluster has 2",
    )  # the width it has, in that type's GPUs
    cli.run("edit", job, "--priority", "5")  # its GPUs and type stay as they are
    shown = cli.json("show", job)
    assert (shown["gpu_type"], shown["gpus_min"], shown["priority"]) == (None, 3, 5)


def test_restart_checks_the_width_and_type_as_submit_does(cli):
    """A copy the cluster could no longer run (its type's GPUs fewer, or gone) is refused
    at restart, one line, nothing queued (before: queued, and the daemon failed it)."""
    (cli.home / "gridshift.toml").write_text(WIDE.replace("fake_gpus = 2", "fake_gpus = 4"))
    wide = str(cli.submit("--gpus", "3", "--gpu-type", "v100", "--", "true"))
    typed = str(cli.submit("--gpu-type", "p100", "--", "true"))
    fine = str(cli.submit("--", "true"))
    cli.run("cancel", wide, typed, fine)
    # the V100 server now has 2 GPUs, and the P100 one holds K80s
    (cli.home / "gridshift.toml").write_text(WIDE.replace("Tesla P100-PCIE-16GB", "Tesla K80"))
    count = cli.job_count()
    _refused(
        cli.run("restart", wide, check=False), f"job {wide}: needs 3 v100 GPUs; the cluster has 2"
    )
    _refused(cli.run("restart", typed, check=False), f"job {typed}: no node has GPU type p100")
    _refused(
        cli.run("restart", fine, typed, check=False), f"job {typed}: no node has GPU type p100"
    )
    assert cli.job_count() == count  # all or none: not even the copy of the one that fits
    (cli.home / "gridshift.toml").write_text(WIDE)
    copy = cli.run("restart", typed).stdout.split()[1].rstrip(":")
    assert cli.json("show", copy)["gpu_type"] == "p100"
