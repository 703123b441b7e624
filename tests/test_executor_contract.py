"""The executors' contract (DESIGN.md): one suite, run against ``local``, ``ssh`` (a real
sshd), ``slurm`` (a real single-node Slurm cluster) and ``simulated``. What a job does is
described, not scripted, so each backend runs the same story: one that finishes, one that
checkpoints on SIGTERM, SIGKILL, SIGSTOP/SIGCONT, progress, and recovery of a started and
of a never-started attempt."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from executors.base import Executor, Handle, LaunchSpec, PollResult, RunStatus
from executors.errors import LaunchError
from executors.local import LocalExecutor
from executors.simulated import SimulatedExecutor, Workload
from orchestrator.sim.events import EventLoop
from tests.conftest import E2E

# A job that reports progress 1 of 2 and then runs ``secs``; SIGTERM makes it checkpoint
# and exit 0, as an interruptible training job does.
JOB = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "open(os.environ['GRIDSHIFT_PROGRESS_FILE'], 'w').write('1 2')\n"
    "time.sleep(float(sys.argv[1]))\n"
)
SHORT_S, LONG_S = 2.0, 120.0  # SHORT_S: time for a few SSH round trips under load
LIVE = (RunStatus.RUNNING, RunStatus.PENDING)  # pending: a batch scheduler has it


class ProcessHarness:
    """Local and SSH: real processes; time passes by itself."""

    def __init__(self, executor: Executor, tmp: Path, node: str | None, make) -> None:
        self.executor, self.tmp, self.node, self._make = executor, tmp, node, make
        (tmp / "logs").mkdir(exist_ok=True)

    def spec(self, attempt: int, seconds: float, command=None) -> LaunchSpec:
        env = {"PATH": os.environ["PATH"]}
        return LaunchSpec(
            job_id=attempt,
            attempt_id=attempt,
            command=command if command is not None else [sys.executable, "-c", JOB, str(seconds)],
            workdir=str(self.tmp),
            env=env,
            gpu_indices=[],
            log_path=str(self.tmp / "logs" / f"{attempt}.log"),
            run_dir=str(self.tmp / "run" / f"attempt-{attempt}"),
            node=self.node,
        )

    def launch(self, attempt: int, seconds: float) -> Handle:
        return self.executor.launch(self.spec(attempt, seconds))

    def until(self, predicate, timeout_s: float = 30.0):
        deadline = time.monotonic() + timeout_s
        while not (got := predicate()):
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)
        return got

    def started(self, handle: Handle) -> None:
        self.until(lambda: self.executor.poll(handle) and self.executor.progress(handle))

    def wait(self, handle: Handle) -> PollResult:
        return self.until(lambda: (r := self.executor.poll(handle)).status not in LIVE and r)

    def fresh(self) -> Executor:
        return self._make()


class SimHarness:
    """Simulated: a job is a workload on a timeline; waiting steps the timeline."""

    def __init__(self) -> None:
        self.loop = EventLoop()
        self.executor = SimulatedExecutor(self.loop)
        self.node = None

    def spec(self, attempt: int, seconds: float, command=None) -> LaunchSpec:
        return LaunchSpec(attempt, attempt, command if command is not None else ["train"],
                          "/", {}, [0], "", f"sim-{attempt}")  # fmt: skip

    def launch(self, attempt: int, seconds: float) -> Handle:
        # progress 1 of 2 straight away, as the process jobs report it
        self.executor.prepare(attempt, Workload(2 * seconds, lambda f: 1.0, lambda f: 100.0,
                                                done=seconds))  # fmt: skip
        return self.executor.launch(self.spec(attempt, seconds))

    def started(self, handle: Handle) -> None:
        assert self.executor.progress(handle) is not None

    def wait(self, handle: Handle) -> PollResult:
        while (r := self.executor.poll(handle)).status in LIVE:
            assert self.loop.step() is not None, "nothing left to happen"
        return r

    def fresh(self) -> Executor:
        return self.executor  # the simulator's state is the executor's


# the real servers' runs time real round trips and share one Slurm cluster: the E2E group
@pytest.fixture(params=["local", pytest.param("ssh", marks=E2E), pytest.param("slurm", marks=E2E),
                        "simulated"])  # fmt: skip
def harness(request, tmp_path, monkeypatch):
    if request.param == "simulated":
        yield SimHarness()
        return
    if request.param == "local":
        yield ProcessHarness(LocalExecutor(), tmp_path, None, LocalExecutor)
        return
    if request.param == "slurm":
        from executors.slurm import SlurmExecutor

        cluster = request.getfixturevalue("slurm_cluster")
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        prefix = f"contract-{tmp_path.name}"  # attempt numbers repeat across tests

        def make_slurm():
            return SlurmExecutor(node="cluster", prefix=prefix)

        yield ProcessHarness(make_slurm(), tmp_path, "cluster", make_slurm)
        return
    from executors.ssh import SshExecutor
    from executors.sshlink import SshLink
    from orchestrator.nodes.ssh import ssh_target
    from orchestrator.settings import NodeConfig
    from tests.conftest import server_python

    servers = request.getfixturevalue("ssh_servers")
    srv = servers(gpus=2)
    cfg = NodeConfig(**srv.node("srv", servers.known_hosts, python=server_python()))

    def make():
        return SshExecutor({"srv": SshLink(ssh_target(cfg))})

    executor = make()
    yield ProcessHarness(executor, tmp_path, "srv", make)
    executor.close()


def test_a_job_runs_to_its_exit(harness):
    handle = harness.launch(1, SHORT_S)
    assert harness.executor.poll(handle).status in LIVE
    result = harness.wait(handle)
    assert result.status is RunStatus.EXITED and result.exit_code == 0
    assert result.ended_at is not None
    assert not harness.executor.signal(handle, signal.SIGTERM), "nothing left to signal"


def test_sigterm_checkpoints_and_sigkill_kills(harness):
    a, b = harness.launch(1, LONG_S), harness.launch(2, LONG_S)
    harness.started(a)
    harness.started(b)
    done, total = harness.executor.progress(a)
    assert done / total == pytest.approx(0.5), "the job's own report: half way"
    assert harness.executor.signal(a, signal.SIGTERM)
    assert harness.executor.signal(b, signal.SIGKILL)
    assert harness.wait(a).exit_code == 0, "a job that checkpoints exits 0"
    assert harness.wait(b).exit_code == 128 + signal.SIGKILL


def test_stop_and_continue_keep_the_job(harness):
    run_s = 3.0  # room for an SSH round trip or two between start and SIGSTOP
    handle = harness.launch(1, run_s)
    harness.started(handle)
    assert harness.executor.signal(handle, signal.SIGSTOP)
    if isinstance(harness, ProcessHarness):
        time.sleep(run_s + 0.5)  # stopped: it cannot finish meanwhile
    assert harness.executor.poll(handle).status is RunStatus.RUNNING
    assert harness.executor.signal(handle, signal.SIGCONT)
    assert harness.wait(handle).exit_code == 0


def test_a_started_attempt_is_recovered_not_restarted(harness):
    handle = harness.launch(1, SHORT_S)
    harness.started(handle)
    harness.executor = harness.fresh()  # a restarted daemon's executor
    again = harness.executor.recover(1, handle.run_dir, harness.node)
    assert again is not None
    assert again.data.get("log_path") == handle.data.get("log_path"), "its log found again"
    result = harness.wait(again)
    assert result.status is RunStatus.EXITED and result.exit_code == 0


def test_an_attempt_that_never_started_is_not_recovered(harness):
    spec = harness.spec(7, SHORT_S)
    assert harness.executor.recover(7, spec.run_dir, harness.node) is None


def test_an_empty_command_is_refused(harness):
    with pytest.raises(LaunchError):
        harness.executor.launch(harness.spec(3, SHORT_S, command=[]))
