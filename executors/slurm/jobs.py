"""What Slurm's commands print, parsed: ``squeue``'s and ``sacct --parsable2``'s lines,
``code:signal`` exit codes, GRES strings and Slurm's local timestamps."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

LIVE = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED"}
RUNNING = {"RUNNING", "COMPLETING", "STOPPED", "SIGNALING", "STAGE_OUT"}
LOST = {"NODE_FAIL", "BOOT_FAIL", "LAUNCH_FAILED"}
SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "Start", "End", "ConsumedEnergyRaw")


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
    held: bool = False  # pending on a hold (``sbatch --hold``) until released

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
