"""Slurm's answers after submission, without a controller: Slurm's commands are small
scripts here that answer as a cluster would that purged a job (no accounting), held one
at submission, or cancelled one. A job Slurm forgot ended with an unknown outcome: it is
never requeued as "not started" (it may have run to its end); a launch whose lease was
lost before it was recorded is withdrawn (its held job cancelled before it ran)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from executors.base import Handle, RunStatus
from executors.slurm import SlurmExecutor
from orchestrator.queue import attempts
from orchestrator.queue.attempts import AttemptState
from orchestrator.queue.db import Database
from orchestrator.queue.models import Attempt, Job

NOW = datetime(2026, 1, 1, tzinfo=UTC)
pytestmark = pytest.mark.backends("sqlite")


def _fake_slurm(bin_dir: Path, log: Path, squeue: str = "") -> None:
    """Slurm's five commands: each records its arguments; squeue prints ``squeue``;
    sacct and scontrol show know no job (a purged job on a cluster without accounting)."""
    bin_dir.mkdir()
    answers = {"squeue": f"printf '{squeue}'", "sacct": "exit 1", "scontrol": "exit 1",
               "sbatch": "echo 4242", "scancel": "true"}  # fmt: skip
    for name, body in answers.items():
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n{body}\n')
        path.chmod(0o755)


def test_a_job_slurm_no_longer_knows_ended_with_an_unknown_outcome(tmp_path):
    _fake_slurm(tmp_path / "bin", tmp_path / "calls")
    ex = SlurmExecutor(node="cluster", bin_dir=str(tmp_path / "bin"))
    handle = Handle(7, str(tmp_path / "run"), {"node": "cluster", "slurm_job_id": "4242"})
    ex.refresh([handle])
    result = ex.poll(handle)
    assert result.status is RunStatus.LOST and result.unknown_outcome
    assert "no longer knows job 4242" in result.detail


def test_a_held_job_of_a_recorded_attempt_is_released(tmp_path):
    calls = tmp_path / "calls"
    _fake_slurm(
        tmp_path / "bin", calls, squeue=r"4242|gridshift-a7|PENDING|N/A|gpu:1|JobHeldUser\n"
    )
    ex = SlurmExecutor(node="cluster", bin_dir=str(tmp_path / "bin"))
    handle = Handle(7, str(tmp_path / "run"), {"node": "cluster", "slurm_job_id": "4242"})
    ex.refresh([handle])
    assert ex.poll(handle).status is RunStatus.PENDING
    assert "scontrol release 4242" in calls.read_text()


def _submitted(db: Database, run_dir: Path, job_state: str = "planned") -> int:
    with db.write() as session:
        job = Job(state=job_state, user="u", uid=os.getuid(), command=["true"], workdir="/",
                  gpus_min=1, gpus_max=1, submitted_at=NOW, attempts=1)  # fmt: skip
        session.add(job)
        session.flush()
        att = attempts.begin(session, at=NOW, job_id=job.id, number=1, node="cluster",
                             gpu_ids=[0], run_dir=str(run_dir))  # fmt: skip
        data = {"node": "cluster", "slurm_job_id": "4242"}
        attempts.move(session, att, AttemptState.SUBMITTED, at=NOW,
                      handle=Handle(att.id, str(run_dir), data).to_dict())  # fmt: skip
        return job.id


@pytest.mark.parametrize("job_state", ["planned", "running"])
def test_the_reaper_never_requeues_a_purged_job_as_not_started(tmp_path, job_state):
    from orchestrator.accounting.meter import Accountant
    from orchestrator.daemon.reaper import Reaper

    _fake_slurm(tmp_path / "bin", tmp_path / "calls")
    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    job_id = _submitted(db, tmp_path / "run", job_state)
    ex = SlurmExecutor(node="cluster", bin_dir=str(tmp_path / "bin"))
    settings = SimpleNamespace(cancel_grace_s=10.0)
    reaper = Reaper(db=db, executor=ex, settings=settings, nodes=[],
                    accountant=Accountant(lambda a, b: None, lambda a, b: None,
                                          lambda a: 0.0))  # fmt: skip
    assert reaper.reap(datetime.now(UTC)) == 1
    with db.read() as session:
        job = session.get(Job, job_id)
        assert job.state == "lost", job.state
        assert "ended with unknown outcome" in job.reason and "not rerun" in job.reason
        (att,) = session.exec(__import__("sqlmodel").select(Attempt)).all()
        assert att.state == "lost"
    reaper.reap(datetime.now(UTC))  # and it stays so: never queued, never run again
    with db.read() as session:
        assert session.get(Job, job_id).state == "lost"


def test_a_launch_whose_lease_was_lost_is_withdrawn_before_it_ran(tmp_path):
    from orchestrator.daemon.dispatch import Dispatcher
    from orchestrator.daemon.lease import LeaseLost
    from orchestrator.nodes.inventory import ResolvedNode
    from orchestrator.queue.ownership import current_user
    from orchestrator.settings import NodeConfig, Settings

    calls = tmp_path / "calls"
    _fake_slurm(tmp_path / "bin", calls)
    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    with db.write() as session:
        job = Job(state="queued", user="u", uid=os.getuid(), command=["true"],
                  workdir=str(tmp_path), gpus_min=1, gpus_max=1, submitted_at=NOW)  # fmt: skip
        session.add(job)
        session.flush()
        session.expunge(job)
    settings = Settings(home=tmp_path / "home")
    node = ResolvedNode("cluster", "slurm", (), "config",
                        config=NodeConfig(name="cluster", executor="slurm", gpus=1))  # fmt: skip
    ex = SlurmExecutor(node="cluster", bin_dir=str(tmp_path / "bin"))
    checks = []

    def lease_check(_session) -> None:  # held for transaction 1, lost by transaction 2
        checks.append(1)
        if len(checks) > 1:
            raise LeaseLost("this daemon's lease expired or was taken over")

    d = Dispatcher(settings=settings, db=db, executor=ex, nodes=[node], user=current_user(),
                   lease_check=lease_check)  # fmt: skip
    with pytest.raises(LeaseLost):
        d.launch(job, "cluster", [0], NOW)
    said = calls.read_text()
    assert "sbatch --parsable --hold" in said, said
    assert "scancel 4242" in said and "release" not in said, said
    with db.read() as session:
        (att,) = session.exec(__import__("sqlmodel").select(Attempt)).all()
        assert att.state == "launching", "left for the lease holder's recovery"


# What each machine's process was told, written to OUT.<NODE_RANK>.
TELL = (
    "import json, os, sys\n"
    "keys = ['MASTER_ADDR', 'MASTER_PORT', 'WORLD_SIZE', 'NODE_RANK', 'NPROC_PER_NODE',\n"
    "        'NNODES']\n"
    "path = sys.argv[1] + '.' + os.environ['NODE_RANK']\n"
    "json.dump({k: os.environ[k] for k in keys}, open(path, 'w'))\n"
)
# srun on two machines of 2 GPUs each: the task once per machine, as Slurm would run it
SRUN = """#!/bin/sh
echo "srun $*" >> {calls}
while [ "${{1#--}}" != "$1" ]; do shift; done
SLURM_NODEID=0 SLURM_LAUNCH_NODE_IPADDR=10.0.0.1 SLURM_GPUS_ON_NODE=2 "$@" &
SLURM_NODEID=1 SLURM_LAUNCH_NODE_IPADDR=10.0.0.1 SLURM_GPUS_ON_NODE=2 "$@"
wait
"""


def test_a_job_wider_than_a_machine_runs_one_process_per_machine(tmp_path):
    import json
    import subprocess
    import sys

    from executors.base import LaunchSpec
    from orchestrator.daemon.launchspec import slurm_machines

    assert slurm_machines(4, SimpleNamespace(gpus_per_node=2)) == 2
    assert slurm_machines(5, SimpleNamespace(gpus_per_node=4)) == 2
    assert slurm_machines(4, SimpleNamespace(gpus_per_node=4)) == 1
    assert slurm_machines(8, SimpleNamespace(gpus_per_node=None)) == 1, "unset: one machine"
    from orchestrator.daemon.launchspec import launch_spec
    from orchestrator.nodes.inventory import ResolvedNode
    from orchestrator.settings import NodeConfig, Settings

    cfg = NodeConfig(name="cluster", executor="slurm", gpus=16, gpus_per_node=4)
    node = ResolvedNode("cluster", "slurm", (), "config", config=cfg)
    job = Job(id=3, state="queued", user="u", uid=os.getuid(), command=["true"], workdir="/",
              gpus_min=8, gpus_max=8, submitted_at=NOW)  # fmt: skip
    att = Attempt(id=7, job_id=3, number=1, state="launching", node="cluster",
                  gpu_ids=list(range(8)), run_dir=str(tmp_path / "run"))  # fmt: skip
    wide = launch_spec(Settings(home=tmp_path / "home"), job, att, node)
    assert wide.nodes == 2 and wide.env["NNODES"] == "2" and wide.env["WORLD_SIZE"] == "8"
    narrow = launch_spec(Settings(home=tmp_path / "home"), job, att.model_copy(
        update={"gpu_ids": [0, 1, 2, 3]}), node)  # fmt: skip
    assert narrow.nodes == 1 and "NNODES" not in narrow.env, "one machine: as before"
    calls, bin_dir, out = tmp_path / "calls", tmp_path / "bin", tmp_path / "rank"
    _fake_slurm(bin_dir, calls)
    (bin_dir / "sbatch").write_text(
        f'#!/bin/sh\necho "sbatch $*" >> {calls}\ncat > {tmp_path / "script"}\necho 4242\n'
    )
    (bin_dir / "srun").write_text(SRUN.format(calls=calls))
    (bin_dir / "srun").chmod(0o755)
    ex = SlurmExecutor(node="cluster", bin_dir=str(bin_dir))
    env = {"PATH": os.environ["PATH"], "MASTER_PORT": "20007", "NNODES": "2", "WORLD_SIZE": "4"}
    spec = LaunchSpec(7, 7, [sys.executable, "-c", TELL, str(out)], str(tmp_path), env,
                      [0, 1, 2, 3], str(tmp_path / "7.log"), str(tmp_path / "run"),
                      node="cluster", nodes=2)  # fmt: skip
    ex.launch(spec)
    sbatch = next(line for line in calls.read_text().splitlines() if line.startswith("sbatch"))
    assert {"--nodes=2", "--gpus=4", "--ntasks-per-node=1"} <= set(sbatch.split())
    assert "--gres" not in sbatch, "the GPUs are the job's in all, not each machine's"
    subprocess.run(["sh", str(tmp_path / "script")], check=True, timeout=30)
    assert "--kill-on-bad-exit=1" in calls.read_text(), "a machine's failure ends the others"
    zero, one = (json.loads(Path(f"{out}.{rank}").read_text()) for rank in (0, 1))
    assert zero["MASTER_ADDR"] == one["MASTER_ADDR"] == "10.0.0.1"
    assert zero["MASTER_PORT"] == one["MASTER_PORT"] == "20007"
    assert (zero["NODE_RANK"], one["NODE_RANK"]) == ("0", "1")
    assert zero["NPROC_PER_NODE"] == "2" and zero["WORLD_SIZE"] == "4" and one["NNODES"] == "2"
