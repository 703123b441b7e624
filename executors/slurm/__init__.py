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

Slurm's commands run by absolute path with an environment the daemon builds
(``commands.py``): a job's environment reaches the job only, through its batch script
(``--export=NONE``), and a job of another user is submitted as that user, so Slurm runs
and accounts it as its submitter. Parsing Slurm's answers is ``jobs.py``.

Jobs on the cluster that are not gridshift's (submitted by hand) are capacity gridshift
cannot use: ``foreign_gpus()`` counts the GPUs their running allocations hold.
"""

from __future__ import annotations

import logging
import math
import signal as _signal
import time
from datetime import UTC, datetime
from pathlib import Path

from executors import runfiles
from executors.base import Executor, Handle, LaunchSpec, PollResult, RunStatus
from executors.errors import ExecutorError, HostUnreachable, LaunchError
from executors.slurm.commands import (
    JOB_DIR,
    Commands,
    RunAs,
    batch_script,
    find,
    prepare_user_files,
    read_small,
)
from executors.slurm.jobs import (
    LIVE,
    LOST,
    RUNNING,
    SACCT_FIELDS,
    SlurmJob,
    format_time,
    parse_exit,
    parse_gres_gpus,
    parse_sacct,
    parse_time,
)

log = logging.getLogger(__name__)

RECORD = "slurm.json"
# an ended job whose end time Slurm's records do not hold yet (slurmdbd stores it a moment
# later) is polled as still running this long, then ends when it was first seen ended
END_TIME_WAIT_S = 30.0


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
        bin_dir: str | None = None,
    ) -> None:
        self.node = node
        self.prefix = prefix
        self.partition = partition
        self.account = account
        self.extra_args = list(extra_args or [])
        self.commands = Commands(bin_dir, command_timeout_s)  # found once, by absolute path
        self._queue: dict[str, SlurmJob] | None = None  # squeue, as of the last refresh
        self._fresh: set[str] = set()  # jobs the last refresh covered, not yet polled
        self._down: tuple[float, str] | None = None  # since when, and why, Slurm cannot answer
        self._done: dict[str, SlurmJob] = {}  # sacct's finished jobs (they do not change)
        self._unended: dict[str, float] = {}  # ended, no end time recorded yet: seen since

    # -- commands -----------------------------------------------------------------------
    def _run(self, name: str, *args: str, check: bool = True, **kw):
        return self.commands.run(name, *args, check=check, **kw)

    def job_name(self, attempt_id: int) -> str:
        return f"{self.prefix}-a{attempt_id}"

    # -- launch -------------------------------------------------------------------------
    def _do_launch(self, spec: LaunchSpec) -> Handle:
        """``sbatch`` with a daemon-built environment, as the job's user when that is not
        the daemon's; the job's environment travels in the script (``--export=NONE``)."""
        run_dir = Path(spec.run_dir)
        who = RunAs.of(spec.run_as_uid, spec.run_as_gid)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            if who:  # Slurm reaches the job's own directory inside as its user
                run_dir.chmod(0o711)
            Path(spec.log_path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LaunchError(f"cannot write {run_dir}: {exc}") from exc
        job_dir = prepare_user_files(run_dir, Path(spec.log_path), who) if who else run_dir
        # held: it cannot start before the daemon recorded it (``release``), so a launch
        # that lost its lease meanwhile can be withdrawn before it ever ran
        argv = ["--parsable", "--hold", f"--job-name={self.job_name(spec.attempt_id)}",
                f"--output={spec.log_path}", "--open-mode=append", f"--chdir={spec.workdir}",
                "--export=NONE", f"--nodes={spec.nodes}"]  # fmt: skip
        if spec.nodes > 1:  # across machines: its GPUs in all, one task per machine
            argv += [f"--gpus={len(spec.gpu_indices)}", "--ntasks-per-node=1"]
        elif spec.gpu_indices:
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
        argv += self.extra_args
        env = {**spec.env, "GRIDSHIFT_PROGRESS_FILE": str(job_dir / runfiles.PROGRESS)}
        srun = find("srun", self.commands.bin_dir) or "srun"
        script = batch_script(spec.command, env, spec.nodes, srun)
        try:
            out = self._run("sbatch", *argv, stdin=script, as_user=who).stdout.strip()
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
        out = self._run("squeue", "-h", "-a", "-t", "all", "-o", "%i|%j|%T|%S|%b|%r").stdout
        jobs = {}
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) != 6:
                continue
            job_id, name, state, start, gres, reason = parts
            started = parse_time(start) if state in RUNNING else None
            held = state == "PENDING" and reason.startswith("JobHeld")
            jobs[job_id] = SlurmJob(job_id, name, state, started_at=started,
                                    gpus=parse_gres_gpus(gres), held=held)  # fmt: skip
        return jobs

    def _sacct(self, job_ids: list[str]) -> dict[str, SlurmJob]:
        proc = self._run("sacct", "--parsable2", "--noheader", "-j", ",".join(job_ids),
                         "-o", ",".join(SACCT_FIELDS), check=False)  # fmt: skip
        if proc.returncode != 0:  # no accounting on this cluster: squeue alone
            return {}
        found = parse_sacct(proc.stdout)
        for job_id, job in found.items():
            if job.state not in LIVE | RUNNING and job.ended_at is not None:
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
        if state not in LIVE | RUNNING and job.ended_at is not None:
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
        if job is None:  # purged, and no accounting: it may have run to its end
            return PollResult(RunStatus.LOST, detail=f"Slurm no longer knows job {job_id}",
                              unknown_outcome=True)  # fmt: skip
        self._mirror(handle, job)
        if job.held:  # recorded (it is polled), its release not done: a crash in between
            self.release(handle)
        if job.state in LIVE:
            return PollResult(RunStatus.PENDING, detail=f"Slurm job {job_id} {job.state}")
        if job.state in RUNNING:
            return PollResult(RunStatus.RUNNING, started_at=job.started_at)
        if job.state in LOST:
            return PollResult(RunStatus.LOST, detail=f"Slurm job {job_id} {job.state}",
                              started_at=job.started_at)  # fmt: skip
        ended_at = job.ended_at
        if ended_at is None:  # Slurm says ended before its records hold the end time
            seen = self._unended.setdefault(job_id, time.time())
            if time.time() - seen < END_TIME_WAIT_S:
                return PollResult(RunStatus.RUNNING, started_at=job.started_at)
            ended_at = datetime.fromtimestamp(seen, UTC)  # when it was first seen ended
        self._unended.pop(job_id, None)
        detail = None if job.state == "COMPLETED" else f"Slurm job {job_id} {job.state}"
        return PollResult(RunStatus.EXITED, exit_code=job.exit_code, signal=job.signal,
                          ended_at=ended_at, energy_j=job.energy_j,
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
        run_dir = Path(handle.run_dir)
        for path in (run_dir / JOB_DIR / runfiles.PROGRESS, run_dir / runfiles.PROGRESS):
            text = read_small(path)
            if text is not None:
                return runfiles.parse_progress(text)
        return None

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

    def release(self, handle: Handle) -> None:
        """Let a recorded attempt's held job start (``sbatch --hold`` at launch)."""
        job_id = handle.data.get("slurm_job_id")
        if job_id:
            self._run("scontrol", "release", job_id, check=False)
            self._queue = None

    def withdraw(self, handle: Handle) -> None:
        """A held job whose launch was not recorded (the lease was lost meanwhile, or
        another daemon settled the attempt): cancelled before it ever ran."""
        job_id = handle.data.get("slurm_job_id")
        if job_id:
            self._run("scancel", job_id)
            self._queue = None

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
