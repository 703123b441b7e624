"""What a submitter's environment can and cannot do on the real single-node Slurm cluster:
their ``PATH`` (a fake ``sbatch`` first), ``LD_PRELOAD`` and ``SBATCH_*`` reach their job,
never the Slurm commands the daemon runs; and a job of another user runs, and is
accounted, as that user."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from executors.base import LaunchSpec, RunStatus
from executors.slurm import SlurmExecutor
from executors.slurm.commands import batch_script, command_env, find
from tests.helpers.users import lab_users
from tests.helpers.waiting import wait_for

COMMANDS = ("sbatch", "squeue", "sacct", "scancel", "scontrol")
# a library that notes every process it is loaded into: its name and uid
CANARY_C = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void note(void) {
    char comm[64] = "?"; FILE *f = fopen("/proc/self/comm", "r");
    if (f) { if (!fgets(comm, sizeof comm, f)) comm[0] = 0; fclose(f); }
    FILE *out = fopen(CANARY, "a");
    if (out) { fprintf(out, "%u %s", (unsigned)getuid(), comm); fclose(out); }
}
"""


@pytest.fixture
def world(tmp_path):
    """A directory every test user can reach (pytest's own tmp is root's, 0700)."""
    base = Path(tempfile.mkdtemp(prefix="gs-slurm-trust-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _hostile_env(world: Path) -> tuple[dict[str, str], Path]:
    """A submitter's environment built to take over Slurm's commands."""
    canary = world / "canary"
    fake = world / "fakebin"
    fake.mkdir()
    for name in COMMANDS:
        path = fake / name
        path.write_text(f'#!/bin/sh\necho "fake {name} $(id -u)" >> {canary}\necho 424242\n')
        path.chmod(0o755)
    env = {
        "PATH": f"{fake}:/usr/bin:/bin",
        "SBATCH_PARTITION": "nowhere",  # sbatch would refuse: no such partition
        "SBATCH_JOB_NAME": "hijacked",
        "SBATCH_EXPORT": "ALL",
        "SLURM_CONF": str(world / "no-such-slurm.conf"),
        "MY_SETTING": "it's $(kept) `literally`",
    }
    if shutil.which("cc"):
        src, lib = world / "canary.c", world / "canary.so"
        src.write_text(CANARY_C)
        subprocess.run(["cc", "-shared", "-fPIC", f'-DCANARY="{canary}"', "-o", str(lib),
                        str(src)], check=True, capture_output=True)  # fmt: skip
        lib.chmod(0o755)
        env["LD_PRELOAD"] = str(lib)
    return env, canary


def _spec(world: Path, attempt: int, command: list[str], env: dict, **kw) -> LaunchSpec:
    (world / "logs").mkdir(exist_ok=True)
    return LaunchSpec(
        job_id=attempt, attempt_id=attempt, command=command, workdir=str(world), env=env,
        gpu_indices=[0], log_path=str(world / "logs" / f"{attempt}.log"),
        run_dir=str(world / "run" / f"attempt-{attempt}"), node="cluster", **kw,
    )  # fmt: skip


def _ended(ex: SlurmExecutor, handle):
    return wait_for(lambda: (r := ex.poll(handle)).status is RunStatus.EXITED and r, 60,
                    "the Slurm job to end")  # fmt: skip


def _sacct(cluster, job_id: str, fields: str) -> list[str]:
    """sacct's record of a job once slurmdbd has all of it (its first one, before the
    controller's start message, reads JobName=allocation)."""
    argv = ("sacct", "-X", "-n", "--parsable2", "-j", job_id, "-o", f"JobName,{fields}")

    def full():
        name, *rest = cluster.cmd(*argv).stdout.strip().split("|")
        return name not in ("", "allocation") and [name, *rest]

    return wait_for(full, 15, f"sacct {job_id}")[1:]


def test_commands_run_by_absolute_path_with_an_environment_the_daemon_builds(monkeypatch):
    monkeypatch.setenv("PATH", "/nowhere")
    monkeypatch.setenv("LD_PRELOAD", "/nowhere/x.so")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/test.conf")
    env = command_env()
    assert env["PATH"] == "/usr/sbin:/usr/bin:/sbin:/bin"
    assert env["SLURM_CONF"] == "/etc/slurm/test.conf", "the daemon's own, not a job's"
    assert "LD_PRELOAD" not in env and not any(k.startswith("SBATCH_") for k in env)
    assert find("sbatch") is None or os.path.isabs(find("sbatch"))
    script = batch_script(["sh", "-c", "echo $X"], {"X": "a'b", "SLURM_JOB_ID": "1",
                                                     "BASH_FUNC_f%%": "() { :; }"})  # fmt: skip
    assert "export X='a'\"'\"'b'" in script and "SLURM_JOB_ID=" not in script
    assert "BASH_FUNC" not in script and script.rstrip().endswith("exec sh -c 'echo $X'")


def test_a_submitters_path_ld_preload_and_sbatch_vars_reach_only_their_job(
    slurm_cluster, world, monkeypatch
):
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))  # the daemon's own
    env, canary = _hostile_env(world)
    ex = SlurmExecutor(node="cluster", prefix=f"trust-{world.name}")
    show = 'echo "setting=$MY_SETTING"; echo "path=$PATH"; echo "job=$SLURM_JOB_ID"'
    handle = ex.launch(_spec(world, 1, ["/bin/sh", "-c", show], env))
    job_id = handle.data["slurm_job_id"]
    assert job_id != "424242", "the real sbatch answered"
    result = _ended(ex, handle)
    assert result.exit_code == 0, Path(world / "logs" / "1.log").read_text()
    out = (world / "logs" / "1.log").read_text().splitlines()
    assert f"setting={env['MY_SETTING']}" in out, "the job got its environment, literally"
    assert f"path={env['PATH']}" in out and f"job={job_id}" in out
    name, partition = _sacct(slurm_cluster, job_id, "JobName,Partition")
    assert name == ex.job_name(1) and partition == "main", "SBATCH_* did not reach sbatch"
    noted = canary.read_text().splitlines() if canary.exists() else []
    ran = [line for line in noted if line.split()[-1] in COMMANDS]
    assert ran == [], f"a submitter's file ran as a Slurm command: {ran}"
    if "LD_PRELOAD" in env:  # the preload reached the job, which is theirs to run
        assert any(line.split()[-1] == "sh" for line in noted), noted


def test_a_slurm_job_runs_and_is_accounted_as_its_submitter(slurm_cluster, world, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    ex = SlurmExecutor(node="cluster", prefix=f"as-user-{world.name}")
    with lab_users(world) as lab:
        alice = lab.alice
        report = (
            'id -u; id -g; echo "1 2" > "$GRIDSHIFT_PROGRESS_FILE"; '
            "cat /etc/shadow >/dev/null 2>&1 && echo read-shadow || echo no-shadow"
        )
        spec = _spec(world, 2, ["/bin/sh", "-c", report], {"PATH": "/usr/bin:/bin"},
                     run_as_uid=alice.uid)  # fmt: skip
        spec = LaunchSpec(**{**spec.to_dict(), "workdir": str(alice.home)})
        handle = ex.launch(spec)
        assert _ended(ex, handle).exit_code == 0
        log = Path(spec.log_path)
        uid, gid, shadow = log.read_text().split()
        assert (int(uid), int(gid), shadow) == (alice.uid, alice.gid, "no-shadow")
        st = log.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (alice.uid, 0o600), "the log is theirs"
        assert ex.progress(handle) == (1.0, 2.0), "written where the job may write"
        user = _sacct(slurm_cluster, handle.data["slurm_job_id"], "User")[0]
        assert user == pwd.getpwuid(alice.uid).pw_name
        # the daemon's own files in the run directory stay the daemon's
        record = Path(spec.run_dir) / "slurm.json"
        assert record.stat().st_uid == os.geteuid()
