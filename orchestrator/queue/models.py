"""Database tables (SQLModel). Times are stored as naive UTC and read back as aware UTC."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Column, DateTime, TypeDecorator
from sqlmodel import Field, SQLModel


class UTCDateTime(TypeDecorator):
    """Aware UTC datetimes on every backend (SQLite has no time zones)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the database; gridshift is UTC inside")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


def _utc(nullable: bool = True, index: bool = False) -> Any:
    return Field(default=None, sa_column=Column(UTCDateTime(), nullable=nullable, index=index))


def _json(default_factory) -> Any:
    return Field(default_factory=default_factory, sa_column=Column(JSON, nullable=False))


# Ids other rows (the usage ledger) and files (logs, run directories) outlive: never reused.
# SQLite reuses the highest rowid once it is deleted unless the table says AUTOINCREMENT;
# PostgreSQL's sequences never go back.
_IDS_NEVER_REUSED = {"sqlite_autoincrement": True}


class Job(SQLModel, table=True):
    __table_args__ = _IDS_NEVER_REUSED

    id: int | None = Field(default=None, primary_key=True)
    name: str | None = None
    state: str = Field(index=True)
    reason: str | None = None
    user: str
    uid: int
    command: list[str] = _json(list)
    workdir: str
    env: dict[str, str] = _json(dict)
    gpus_min: int
    gpus_max: int
    duration_s: float | None = None  # expected run time at full width and full power
    deadline: datetime | None = _utc()
    interruptible: bool = False
    share: bool | None = False  # may share its GPU with another that may (0011; NULL: no)
    checkpoint_s: float | None = None  # run time a suspension costs it; None: the lab's
    priority: int = 0
    labels: list[str] = _json(list)
    submitted_at: datetime = _utc(nullable=False, index=True)  # the recent load: by time
    started_at: datetime | None = _utc()
    finished_at: datetime | None = _utc()
    exit_code: int | None = None
    node: str | None = None
    gpu_ids: list[int] = _json(list)
    energy_j: float | None = None  # over its attempts: measured, else modelled
    carbon_g: float | None = None
    cost: float | None = None  # in the price signal's currency
    energy_modelled: bool | None = None  # some of energy_j is modelled, not measured
    cancel_requested_at: datetime | None = _utc()
    attempts: int = 0
    planned_start: datetime | None = _utc()  # the daemon's plan for a queued job
    plan_note: str | None = None  # why it waits, in words
    cron_id: int | None = Field(default=None, index=True)  # the template it came from
    gpu_type: str | None = None  # the GPU type it asked for (--gpu-type); None: any


class Dependency(SQLModel, table=True):
    job_id: int = Field(foreign_key="job.id", primary_key=True)
    after_id: int = Field(foreign_key="job.id", primary_key=True, index=True)


class Attempt(SQLModel, table=True):
    """One try at running a job; its states are ``queue.attempts.AttemptState``."""

    __table_args__ = _IDS_NEVER_REUSED

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True)
    number: int
    state: str = Field(index=True)
    node: str
    gpu_ids: list[int] = _json(list)
    run_dir: str
    handle: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    run_as_uid: int | None = None
    started_at: datetime | None = _utc()
    finished_at: datetime | None = _utc()
    exit_code: int | None = None
    signal: int | None = None
    energy_j: float | None = None
    progress_done: float | None = None  # the job's own report, see GRIDSHIFT_PROGRESS_FILE
    progress_total: float | None = None
    progress_at: datetime | None = _utc()
    term_sent_at: datetime | None = _utc()
    kill_sent_at: datetime | None = _utc()
    detail: str | None = None
    cap: float | None = None  # power-cap fraction applied to its GPUs (None: uncapped)
    gpu_model: str | None = None  # the model of the GPUs it ran on (the node's inventory)
    planned_until: datetime | None = _utc()  # the end of its planned piece: suspend then
    suspend_sent_at: datetime | None = _utc()  # SIGTERM sent to checkpoint (signal mode)
    stopped_at: datetime | None = _utc()  # SIGSTOP sent (stop mode); None once resumed
    carbon_g: float | None = None
    cost: float | None = None
    energy_modelled: bool | None = None  # no energy counter: energy_j is the model's
    accounted_until: datetime | None = _utc()
    # A start its deadline forced although the budget said wait: what it was expected to
    # spend when it started (g CO2e, and Wh for an energy budget). None: not forced.
    forced_g: float | None = None
    forced_wh: float | None = None
    # A job across servers: one part per server, rank order ({"node", "gpu_ids"}; the
    # first is ``node``/``gpu_ids``). None: a single-node attempt.
    parts: list[dict[str, Any]] | None = Field(default=None, sa_column=Column(JSON))
    # The width the resize step's SIGTERM asked it to start again on (an elastic job):
    # its next attempt's, kept across daemon restarts. None: not resized.
    resize_to: int | None = None
    # Started ahead of a blocked job (backfill) on the promise of giving its GPUs back by
    # then (its run time and a grace); past it, stopped while a job it passed waits.
    backfilled_until: datetime | None = _utc()


class Usage(SQLModel, table=True):
    """What one attempt used on one UTC day (budgets and reports add these up). Rewritten
    whole from the attempt's power log, never added to: each run is counted once. A row
    outlives its attempt (no foreign key): ``gridshift clean`` keeps the ledger budgets
    add up."""

    attempt_id: int = Field(primary_key=True)
    day: datetime = Field(sa_column=Column(UTCDateTime(), primary_key=True))
    job_id: int = Field(index=True)
    energy_j: float = 0.0
    carbon_g: float = 0.0
    cost: float | None = None


class CronTemplate(SQLModel, table=True):
    """A recurring job: each occurrence of ``cron`` queues the job with a deadline of the
    occurrence plus ``window_s``."""

    id: int | None = Field(default=None, primary_key=True)
    cron: str
    window_s: float
    spec: dict[str, Any] = _json(dict)  # the submission's fields (as in a sweep file)
    env: dict[str, str] = _json(dict)  # the submitting shell's environment
    user: str
    uid: int
    created_at: datetime = _utc(nullable=False)
    last_fire: datetime | None = _utc()  # the latest occurrence dealt with (the cursor)
    removed_at: datetime | None = _utc()
    fault: str | None = None  # why it is disabled or paused ("disabled: ...", "paused: ...")


class Health(SQLModel, table=True):
    """The daemon's last word on itself, for ``gridshift status`` (one row)."""

    id: int = Field(default=1, primary_key=True)
    pid: int
    started_at: datetime = _utc(nullable=False)
    last_tick: datetime = _utc(nullable=False)
    data: dict[str, Any] = _json(dict)


class Lease(SQLModel, table=True):
    """Which daemon serves the queue, until when (daemons sharing one PostgreSQL database:
    one holds the lease, the others stand by). ``epoch`` grows at every takeover."""

    name: str = Field(primary_key=True)
    holder: dict[str, Any] = _json(dict)
    epoch: int = 0
    acquired_at: datetime = _utc(nullable=False)
    expires_at: datetime = _utc(nullable=False)


class Event(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True)
    at: datetime = _utc(nullable=False)
    from_state: str | None = None
    to_state: str
    reason: str | None = None
    actor: str | None = None


class AttemptEvent(SQLModel, table=True):
    """One move of an attempt's state (``orchestrator.queue.attempts``)."""

    id: int | None = Field(default=None, primary_key=True)
    attempt_id: int = Field(foreign_key="attempt.id", index=True)
    job_id: int = Field(index=True)
    at: datetime = _utc(nullable=False)
    from_state: str | None = None
    to_state: str
    reason: str | None = None


class Node(SQLModel, table=True):
    name: str = Field(primary_key=True)
    executor: str
    gpus: int
    gpu_model: str | None = None
    rack: str | None = None
    host: str | None = None
    gpu_source: str  # where the GPU count came from: config, nvml, nvidia-smi, fake, none
    updated_at: datetime = _utc(nullable=False)
    reachable: bool | None = None  # SSH nodes: at the last look (None: never looked)
    last_seen: datetime | None = _utc()
    error: str | None = None  # why it was unreachable at the last look
    # right-sizing (orchestrator.daemon.energy): on, off, waking, powering off, wake failed
    power_state: str | None = None  # None: on (never powered by the daemon)
    power_since: datetime | None = _utc()
    power_error: str | None = None  # the last power command's failure, escaped and cut
    idle_until: datetime | None = _utc()  # its idle energy is in the ledger up to here


class Gpu(SQLModel, table=True):
    node: str = Field(foreign_key="node.name", primary_key=True)
    index: int = Field(primary_key=True)
    uuid: str
    model: str
    memory_mb: int | None = None
    # what nvidia-smi said at the last look (SSH nodes), None where it says N/A
    memory_used_mb: int | None = None
    utilization_pct: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    power_default_w: float | None = None
    power_min_w: float | None = None
    power_max_w: float | None = None


class Calibration(SQLModel, table=True):
    """What one user's runs of a job name measured, to refine its model (online
    calibration): throughput in the job's own work units per second and power per GPU, at
    a width, on a GPU model ("": unknown), both as at full power (a capped run's are
    scaled up). Keyed by the owner's ``uid`` too: another user's jobs of the same name say
    nothing of this user's (-1: rows learnt before owners were recorded, used by none)."""

    name: str = Field(primary_key=True)
    gpus: int = Field(primary_key=True)
    gpu_model: str = Field(default="", primary_key=True)
    uid: int = Field(primary_key=True)
    throughput_per_s: float
    power_w_per_gpu: float | None = None
    samples: int = 0
    updated_at: datetime = _utc(nullable=False)


class IdleUsage(SQLModel, table=True):
    """Idle energy per node and UTC hour (idle GPUs, and the server's own draw while on
    without a job, times the PUE), added to as each stretch is accounted: the stretch and
    the node's ``idle_until`` move in one transaction, so each is counted once. Rows
    written before revision 0013 are per UTC day: each holds its whole day under the
    day's 00:00 (where hours written since may add to it)."""

    __tablename__ = "idle_usage"
    node: str = Field(primary_key=True)
    hour: datetime = Field(sa_column=Column(UTCDateTime(), primary_key=True))
    energy_j: float = 0.0
    carbon_g: float | None = 0.0  # None: some stretch had no signal
