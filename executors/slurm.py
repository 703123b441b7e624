"""The Slurm executor: gridshift decides when, how wide and under what budget; Slurm runs.

Each attempt is one batch job, submitted with ``sbatch``: ``--begin`` at its planned
start, ``--gres=gpu:N``, ``--time`` from the model's estimate plus a margin, ``--signal``
for interruptible jobs (SIGTERM before the time limit, so they checkpoint), and its output
appended to gridshift's log. Its name, ``<prefix>-a<attempt>``, finds it again after a
crash between ``sbatch`` and the record of its id. State comes from ``squeue`` while
Slurm's controller has the job and from ``sacct --parsable2`` once it ended: exit code
(``code:signal``; a signal N reads as 128 + N), start and end, and ``ConsumedEnergyRaw``
(joules) where the cluster accounts energy. The executor mirrors what it learns into the
attempt's run directory (``job.json`` when the job starts, ``power.log`` samples from
Slurm's energy counter), so accounting reads a Slurm attempt as it reads a local one;
without an energy counter the energy is modelled and marked so. Signals go through
``scancel --signal`` (the batch script ``exec``s the command, so the job is the batch
step); a pending job asked to stop is cancelled.

Jobs on the cluster that are not gridshift's (submitted by hand) are capacity gridshift
cannot use: ``foreign_gpus()`` counts the GPUs their running allocations hold.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import signal as _signal
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from executors import runfiles
from executors.base import Executor, Handle, LaunchSpec, PollResult, RunStatus
from executors.errors import ExecutorError, HostUnreachable, LaunchError

log = logging.getLogger("gridshift.executors.slurm")

LIVE = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED"}
RUNNING = {"RUNNING", "COMPLETING", "STOPPED", "SIGNALING", "STAGE_OUT"}
LOST = {"NODE_FAIL", "BOOT_FAIL", "LAUNCH_FAILED"}
SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "Start", "End", "ConsumedEnergyRaw")
UNREACHABLE_SIGNS = ("Unable to contact slurm controller", "Socket timed out",
                     "Connection refused", "Zero Bytes were transmitted")  # fmt: skip
SCRIPT = "job.sbatch"
RECORD = "slurm.json"


@dataclass(frozen=True)
class SlurmJob:
    """One job as Slurm reports it."""

    job_id: str
    name: str
    state: str  # Slurm's word, first token ("CANCELLED by 0" -> CANCELLED)
    exit_code: int | None = None
    signal: int | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    energy_j: float | None = None
    gpus: int = 0

    @property
    def started(self) -> bool:
        return self.started_at is not None


def parse_time(value: str) -> datetime | None:
    """Slurm's local ``YYYY-MM-DDTHH:MM:SS`` (as this host's clock reads it) to UTC."""
    if not value or value in ("Unknown", "None", "N/A"):
        return None
    try:
        return datetime.fromisoformat(value).astimezone(UTC)
    except ValueError:
        return None


def format_time(at: datetime) -> str:
    """UTC to the local time Slurm's commands read."""
    return at.astimezone().replace(tzinfo=None).isoformat(timespec="seconds")


def parse_exit(value: str) -> tuple[int | None, int | None]:
    """``code:signal`` to (exit code, signal) in the shell's convention."""
    try:
        code, sig = (int(p) for p in value.split(":"))
    except ValueError:
        return None, None
    return (128 + sig, sig) if sig else (code, None)


def parse_gres_gpus(value: str) -> int:
    """GPUs in squeue's ``%b`` (``gres/gpu:2``, ``gpu:a100:2``, ``gres:gpu:2``), or 0."""
    total = 0
    for part in value.split(","):
        fields = part.replace("gres/", "").replace("gres:", "").split(":")
        if fields[0] == "gpu":
            try:
                total += int(fields[-1].split("(")[0]) if len(fields) > 1 else 1
            except ValueError:
                total += 1
    return total


def parse_sacct(text: str) -> dict[str, SlurmJob]:
    """``sacct --parsable2 --noheader`` lines: one job per allocation; its energy is the
    allocation's, else the sum of its steps'."""
    jobs: dict[str, SlurmJob] = {}
    steps_energy: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != len(SACCT_FIELDS):
            continue
        job_id, name, state, exit_code, start, end, energy = parts
        joules = float(energy) if energy.strip().replace(".", "", 1).isdigit() else None
        if "." in job_id:  # a step: 12.batch, 12.0
            if joules:
                parent = job_id.split(".")[0]
                steps_energy[parent] = steps_energy.get(parent, 0.0) + joules
            continue
        code, sig = parse_exit(exit_code)
        jobs[job_id] = SlurmJob(job_id, name, state.split()[0] if state else "", code, sig,
                                parse_time(start), parse_time(end), joules or None)  # fmt: skip
    for job_id, joules in steps_energy.items():
        job = jobs.get(job_id)
        if job is not None and job.energy_j is None:
            jobs[job_id] = SlurmJob(**{**job.__dict__, "energy_j": joules})
    return jobs


class SlurmExecutor(Executor):
    name = "slurm"

    def __init__(
        self,
        *,
        node: str | None = None,
        prefix: str = "gridshift",
        partition: str | None = None,
        account: str | None = None,
        extra_args: list[str] | None = None,
        command_timeout_s: float = 30.0,
    ) -> None:
        self.node = node
        self.prefix = prefix
        self.partition = partition
        self.account = account
        self.extra_args = list(extra_args or [])
        self.timeout_s = command_timeout_s
        self._queue: dict[str, SlurmJob] | None = None  # squeue, as of the last refresh
        self._fresh: set[str] = set()  # jobs the last refresh covered, not yet polled
        self._down: tuple[float, str] | None = None  # since when, and why, Slurm cannot answer
        self._done: dict[str, SlurmJob] = {}  # sacct's finished jobs (they do not change)

    # -- commands -----------------------------------------------------------------------
    def _run(self, *argv: str, env: dict[str, str] | None = None, check: bool = True):
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s,
                                  env=env, stdin=subprocess.DEVNULL)  # fmt: skip
        except FileNotFoundError:
            raise ExecutorError(f"{argv[0]} not found: is Slurm's client installed?") from None
        except subprocess.TimeoutExpired:
            raise HostUnreachable(f"{argv[0]} did not answer in {self.timeout_s:g}s") from None
        if check and proc.returncode != 0:
            why = " ".join(proc.stderr.split()) or f"exit {proc.returncode}"
            # the controller is away: the job's fate is unknown, not failed
            gone = any(s in why for s in UNREACHABLE_SIGNS)
            raise (HostUnreachable if gone else ExecutorError)(f"{argv[0]}: {why}")
        return proc

    def job_name(self, attempt_id: int) -> str:
        return f"{self.prefix}-a{attempt_id}"

    # -- launch -------------------------------------------------------------------------
    def _do_launch(self, spec: LaunchSpec) -> Handle:
        run_dir = Path(spec.run_dir)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            Path(spec.log_path).parent.mkdir(parents=True, exist_ok=True)
            script = run_dir / SCRIPT
            script.write_text("#!/bin/sh\n# gridshift: one attempt of one job\nexec "
                              + shlex.join(spec.command) + "\n")  # fmt: skip
            script.chmod(0o700)
            runfiles.write_json(run_dir / runfiles.SPEC, spec.to_dict())
        except OSError as exc:
            raise LaunchError(f"cannot write {run_dir}: {exc}") from exc
        argv = ["sbatch", "--parsable", f"--job-name={self.job_name(spec.attempt_id)}",
                f"--output={spec.log_path}", "--open-mode=append", f"--chdir={spec.workdir}",
                "--export=ALL", "--nodes=1"]  # fmt: skip
        if spec.gpu_indices:
            argv.append(f"--gres=gpu:{len(spec.gpu_indices)}")
        if spec.begin_at is not None:
            argv.append(f"--begin={format_time(datetime.fromisoformat(spec.begin_at))}")
        if spec.time_limit_s:
            argv.append(f"--time={max(1, math.ceil(spec.time_limit_s / 60))}")
        if spec.interruptible and spec.time_limit_s:
            before = int(min(120, max(10, spec.time_limit_s * 0.1)))
            argv.append(f"--signal=B:TERM@{before}")
        if self.partition:
            argv.append(f"--partition={self.partition}")
        if self.account:
            argv.append(f"--account={self.account}")
        argv += [*self.extra_args, str(script)]
        env = {**spec.env, "GRIDSHIFT_PROGRESS_FILE": str(run_dir / runfiles.PROGRESS)}
        for key in ("SLURM_CONF", "PATH"):  # where Slurm's commands find the cluster
            if key in os.environ and key not in env:
                env[key] = os.environ[key]
        try:
            out = self._run(*argv, env=env).stdout.strip()
        except HostUnreachable:
            raise  # submitted or not is unknown: recovery finds it by name, or requeues it
        except ExecutorError as exc:
            raise LaunchError(str(exc)) from None
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise LaunchError(f"sbatch answered {out!r}, not a job id")
        record = {"job_id": job_id, "name": self.job_name(spec.attempt_id)}
        runfiles.write_json(run_dir / RECORD, record)
        log.info("attempt %s: Slurm job %s", spec.attempt_id, job_id)
        data = {"node": spec.node, "slurm_job_id": job_id, "begin_at": spec.begin_at}
        return Handle(spec.attempt_id, str(run_dir), data)

    # -- state --------------------------------------------------------------------------
    def refresh(self, handles: list[Handle]) -> None:
        """One ``squeue`` for the whole cluster (gridshift's jobs and everyone else's),
        then one ``sacct`` for the attempts that left the queue. When the controller does
        not answer (restarting, a network cut), the node reads unreachable for this pass:
        its jobs keep running under Slurm, nothing new goes there, and the loop goes on."""
        ids = [h.data["slurm_job_id"] for h in handles if "slurm_job_id" in h.data]
        try:
            self._queue = self._squeue()
            gone = [j for j in ids if j not in self._done and not self._live(self._queue.get(j))]
            if gone:
                self._sacct(gone)
        except ExecutorError as exc:
            if self._down is None:
                log.warning("Slurm does not answer: %s", exc)
            self._down = (self._down or (time.time(), ""))[0], str(exc)
            self._queue, self._fresh = None, set()
            return
        if self._down is not None:
            log.info("Slurm answers again")
        self._down, self._fresh = None, set(ids)

    def unreachable_nodes(self) -> dict[str, float]:
        return {self.node: self._down[0]} if self._down and self.node else {}

    def _squeue(self) -> dict[str, SlurmJob]:
        out = self._run("squeue", "-h", "-a", "-t", "all", "-o", "%i|%j|%T|%S|%b").stdout
        jobs = {}
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) != 5:
                continue
            job_id, name, state, start, gres = parts
            started = parse_time(start) if state in RUNNING else None
            jobs[job_id] = SlurmJob(job_id, name, state, started_at=started,
                                    gpus=parse_gres_gpus(gres))  # fmt: skip
        return jobs

    def _sacct(self, job_ids: list[str]) -> dict[str, SlurmJob]:
        proc = self._run("sacct", "--parsable2", "--noheader", "-j", ",".join(job_ids),
                         "-o", ",".join(SACCT_FIELDS), check=False)  # fmt: skip
        if proc.returncode != 0:  # no accounting on this cluster: squeue alone
            return {}
        found = parse_sacct(proc.stdout)
        for job_id, job in found.items():
            if job.state not in LIVE | RUNNING:
                self._done[job_id] = job
        return found

    @staticmethod
    def _live(job: SlurmJob | None) -> bool:
        return job is not None and job.state in LIVE | RUNNING

    def lookup(self, job_id: str) -> SlurmJob | None:
        """The job as Slurm knows it now: as the last ``refresh`` found it (once per
        refresh), else asked now. An ended job's record comes from sacct; while slurmdbd has
        not stored it yet (or the cluster keeps no accounting), from ``scontrol show job``."""
        if job_id in self._done:
            return self._done[job_id]
        if job_id in self._fresh and self._queue is not None:
            self._fresh.discard(job_id)
        else:
            self._queue = self._squeue()
        job = self._queue.get(job_id)
        if self._live(job):
            return job
        return self._sacct([job_id]).get(job_id) or self._scontrol(job_id) or job

    def _scontrol(self, job_id: str) -> SlurmJob | None:
        proc = self._run("scontrol", "show", "job", "-o", job_id, check=False)
        fields = dict(w.split("=", 1) for w in proc.stdout.split() if "=" in w)
        if proc.returncode != 0 or fields.get("JobId") != job_id:
            return None
        code, sig = parse_exit(fields.get("ExitCode", ""))
        state = fields.get("JobState", "")
        job = SlurmJob(job_id, fields.get("JobName", ""), state, code, sig,
                       parse_time(fields.get("StartTime", "")),
                       parse_time(fields.get("EndTime", "")))  # fmt: skip
        if state not in LIVE | RUNNING:
            self._done[job_id] = job
        return job

    def _do_poll(self, handle: Handle) -> PollResult:
        job_id = handle.data.get("slurm_job_id")
        if self._down is not None:  # the last refresh found Slurm silent: not asked again
            return PollResult(RunStatus.UNREACHABLE, detail=self._down[1])
        try:
            job = self.lookup(job_id)
        except ExecutorError as exc:
            return PollResult(RunStatus.UNREACHABLE, detail=str(exc))
        if job is None:
            return PollResult(RunStatus.LOST, detail=f"Slurm does not know job {job_id}")
        self._mirror(handle, job)
        if job.state in LIVE:
            return PollResult(RunStatus.PENDING, detail=f"Slurm job {job_id} {job.state}")
        if job.state in RUNNING:
            return PollResult(RunStatus.RUNNING, started_at=job.started_at)
        if job.state in LOST:
            return PollResult(RunStatus.LOST, detail=f"Slurm job {job_id} {job.state}",
                              started_at=job.started_at)  # fmt: skip
        detail = None if job.state == "COMPLETED" else f"Slurm job {job_id} {job.state}"
        return PollResult(RunStatus.EXITED, exit_code=job.exit_code, signal=job.signal,
                          ended_at=job.ended_at, energy_j=job.energy_j,
                          started_at=job.started_at, detail=detail)  # fmt: skip

    def _mirror(self, handle: Handle, job: SlurmJob) -> None:
        """``job.json`` once the job started; a ``power.log`` sample per new energy reading
        (the accounting's meter, as a local monitor writes it)."""
        if job.started_at is None:
            return
        run_dir = Path(handle.run_dir)
        path = run_dir / runfiles.JOB
        try:
            if not path.exists():
                runfiles.write_json(path, {"pid": None, "slurm_job_id": job.job_id,
                                           "started_at": job.started_at.isoformat()})  # fmt: skip
            if job.energy_j is not None:
                power = run_dir / runfiles.POWER
                t = (job.ended_at or datetime.now(UTC)).timestamp()
                with open(power, "a") as fh:
                    if fh.tell() == 0:
                        fh.write(f"{job.started_at.timestamp():.3f} 0\n")
                    fh.write(f"{t:.3f} {job.energy_j:.3f}\n")
        except OSError as exc:
            log.warning("attempt %s: cannot write %s: %s", handle.attempt_id, run_dir, exc)

    def _do_progress(self, handle: Handle) -> tuple[float, float | None] | None:
        try:
            text = (Path(handle.run_dir) / runfiles.PROGRESS).read_text()
        except OSError:
            return None
        return runfiles.parse_progress(text)

    # -- signals, plan changes ----------------------------------------------------------
    def _do_signal(self, handle: Handle, sig: int) -> bool:
        job_id = handle.data.get("slurm_job_id")
        job = self.lookup(job_id)
        if job is None or job.state not in LIVE | RUNNING:
            return False
        if job.state in LIVE:  # not started: stopping it means it never runs
            if sig in (_signal.SIGSTOP, _signal.SIGCONT):
                return False
            self._run("scancel", job_id)
        else:
            name = _signal.Signals(sig).name.removeprefix("SIG")
            # --full reaches the job's children too, but turns KILL into Slurm's cancel
            # (SIGTERM, then SIGKILL after KillWait); --batch delivers a real SIGKILL.
            scope = "--batch" if sig == _signal.SIGKILL else "--full"
            self._run("scancel", scope, f"--signal={name}", job_id)
        self._queue = None
        return True

    def reschedule(self, handle: Handle, begin_at: datetime) -> bool:
        """Move a job that has not started to its new planned start. False once it runs."""
        job_id = handle.data.get("slurm_job_id")
        job = self.lookup(job_id)
        if job is None or job.state not in LIVE:
            return False
        self._run("scontrol", "update", f"JobId={job_id}", f"StartTime={format_time(begin_at)}")
        self._queue = None
        return True

    def foreign_gpus(self) -> dict[str, int]:
        """GPUs held now by running jobs that are not this queue's (the cluster is one
        gridshift node)."""
        if self._down is not None:  # the whole node is held as unreachable meanwhile
            return {}
        try:
            queue = self._queue if self._queue is not None else self._squeue()
        except ExecutorError as exc:
            log.warning("cannot ask Slurm for its queue: %s", exc)
            return {}
        mine = f"{self.prefix}-a"
        busy = sum(j.gpus for j in queue.values()
                   if j.state in RUNNING and not j.name.startswith(mine))  # fmt: skip
        return {self.node: busy} if self.node else {}

    # -- recovery -----------------------------------------------------------------------
    def _do_recover(self, attempt_id: int, run_dir: str, node: str | None) -> Handle | None:
        record = runfiles.read_json(Path(run_dir) / RECORD)
        try:
            job_id = record["job_id"] if record else self._find(self.job_name(attempt_id))
        except ExecutorError as exc:  # cannot tell now: settled when Slurm answers
            raise HostUnreachable(str(exc)) from None
        if job_id is None:
            return None
        return Handle(attempt_id, run_dir, {"node": node, "slurm_job_id": job_id})

    def _find(self, name: str) -> str | None:
        """A job submitted under this name whose id was never recorded (a crash right
        after sbatch): asked of squeue, then of sacct's last week."""
        for job in self._squeue().values():
            if job.name == name:
                return job.job_id
        proc = self._run("sacct", "--parsable2", "--noheader", "-X", f"--name={name}",
                         "-S", "now-7days", "-o", "JobID", check=False)  # fmt: skip
        ids = [line.strip() for line in proc.stdout.splitlines() if line.strip().isdigit()]
        return ids[-1] if ids else None
