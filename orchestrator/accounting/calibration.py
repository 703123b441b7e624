"""Online calibration: what finished attempts measured (throughput from the job's own
progress reports, power from NVML energy counters) refines the model of later runs of
the same job name by the same user (another user's jobs of that name are not this job),
per width and GPU model (the attempt's, from the node's inventory).
A run under a power cap is scaled to full power by its GPU model's curve, so that every
row is as at full power. Measurements are blended with an exponential moving average."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session

from orchestrator.planning.perfmodel import JobModel, PowerCurve, curve_for
from orchestrator.queue.attempts import width_of_attempt
from orchestrator.queue.models import Attempt, Calibration, Job

ALPHA = 0.5  # weight of the newest measurement


def full_power(att: Attempt) -> tuple[float, float]:
    """(throughput, power) factors that bring what ``att`` measured at its power cap to
    full power, by its GPU model's curve (1, 1 when it ran uncapped)."""
    if not att.cap or att.cap >= 1.0:
        return 1.0, 1.0
    curve = curve_for(att.gpu_model)
    f = curve.clamp(att.cap)
    return 1.0 / curve.throughput_fraction(f), curve.power_w(1.0) / curve.power_w(f)


def learn(session: Session, job: Job, att: Attempt, now: datetime) -> Calibration | None:
    """Fold a finished attempt's measurements into its owner's calibration of its name."""
    if not job.name or not att.started_at or not att.finished_at or not att.progress_done:
        return None
    seconds = (att.finished_at - att.started_at).total_seconds()
    width = width_of_attempt(att)  # a job across servers: every part's GPUs
    if seconds <= 0 or width == 0 or (att.parts and not att.gpu_model):
        return None  # across servers whose GPU models differ: no one model to learn
    speed, draw = full_power(att)
    throughput = att.progress_done / seconds * speed
    power = att.energy_j / seconds / width * draw if att.energy_j is not None else None
    row = session.get(Calibration, (job.name, width, att.gpu_model or "", job.uid))
    if row is None:
        row = Calibration(
            name=job.name,
            gpus=width,
            gpu_model=att.gpu_model or "",
            uid=job.uid,
            throughput_per_s=throughput,
            power_w_per_gpu=power,
            samples=1,
            updated_at=now,
        )
    else:
        row.throughput_per_s = ALPHA * throughput + (1 - ALPHA) * row.throughput_per_s
        if power is not None:
            row.power_w_per_gpu = (
                power
                if row.power_w_per_gpu is None
                else ALPHA * power + (1 - ALPHA) * row.power_w_per_gpu
            )
        row.samples += 1
        row.updated_at = now
    session.add(row)
    return row


def model_for(
    session: Session,
    job: Job,
    curve: PowerCurve,
    total_work: float = 1.0,
    gpu_model: str | None = None,
) -> JobModel | None:
    """The job's model: from its declared duration, refined by what earlier runs of the
    same name by the same user measured at the same width on ``gpu_model``. None when
    neither is known."""
    width = job.gpus_max
    key = (job.name, width, gpu_model or "", job.uid)
    row = session.get(Calibration, key) if job.name else None
    if job.duration_s is None and row is None:
        return None
    if row is not None and total_work == 1.0:
        total_work = None  # measured in the job's own units
    duration = job.duration_s or (total_work or 1.0) / row.throughput_per_s
    model = JobModel(
        full_duration_s=duration,
        ref_gpus=width,
        curve=curve,
        total_work=total_work or row.throughput_per_s * duration,
    )
    if row is not None:
        model = model.calibrated(row.throughput_per_s, n=width, f=1.0)
        if row.power_w_per_gpu is not None:
            model = model.with_power_scale(row.power_w_per_gpu / curve.power_w(1.0))
    return model
