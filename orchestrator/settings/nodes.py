"""A node of the cluster as ``[[nodes]]`` tables declare it (``NodeConfig``): its executor,
GPUs, SSH or Slurm access, and the limits on what one node may declare."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: GPUs one node may declare (a Slurm partition planned as one node included), and the
#: pretend GPUs of a test node (each is a row and a monitor thread's worth of work).
MAX_NODE_GPUS = 65_536
MAX_FAKE_GPUS = 1024


def _duration(value: str | None, checkpoint: bool = False) -> str | None:
    if value is not None:
        from orchestrator.timeparse import parse_checkpoint_s, parse_duration_s

        try:
            (parse_checkpoint_s if checkpoint else parse_duration_s)(value)
        except Exception as exc:
            raise ValueError(str(exc)) from None
    return value


def _not_bool(value: object) -> object:
    """A number given as true or false is a mistake (pydantic alone reads true as 1)."""
    if isinstance(value, bool):
        raise ValueError(f"a number, not {str(value).lower()}")
    return value


#: the largest idle draw a GPU is given (the daemon's config and a simulated cluster alike)
MAX_GPU_IDLE_W = 2000.0


class NodeConfig(BaseModel):
    """One ``[[nodes]]`` table."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=255)
    executor: Literal["local", "ssh", "slurm"] = "local"
    gpus: int | None = Field(
        default=None, ge=0, le=MAX_NODE_GPUS, description="count; detected when left out"
    )
    fake_gpus: int | None = Field(default=None, ge=0, le=MAX_FAKE_GPUS)
    gpu_model: str | None = None
    rack: str | None = None
    nvlink_islands: list[list[int]] | None = Field(
        default=None, description="GPU groups sharing the fastest link, e.g. [[0,1,2,3],[4,5,6,7]]"
    )
    host: str | None = None
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = Field(
        default=None,
        description='SSH account; "{user}": each job logs in as its submitter\'s name '
        "(else all jobs share this one account: one trust domain on that server)",
    )
    identity_file: Path | None = None
    # -- SSH nodes ----------------------------------------------------------------------
    known_hosts: Path | None = Field(
        default=None, description="known_hosts file; default: ssh's own (~/.ssh/known_hosts)"
    )
    verify_host_key: bool = Field(
        default=True, description="false trusts any host key (logged at every start)"
    )
    python: str = Field(default="python3", min_length=1, description="python on the server")
    remote_dir: str = Field(default=".gridshift", min_length=1, description="runs and logs "
                            "on the server ({user}: the job's account)")  # fmt: skip
    rendezvous_addr: str | None = Field(default=None, pattern=r"^[A-Za-z0-9.:_\[\]-]{1,255}$",
                                        description="MASTER_ADDR of jobs whose rank 0 is "
                                        "here, as others reach it; default: host")  # fmt: skip
    sudo: bool = Field(default=False, description="power limits through sudo -n nvidia-smi")
    share: Literal["never", "time-slice", "mps"] = Field(
        default="never", description="co-location: two --share jobs on one GPU (not on Slurm)"
    )
    share_users: Literal["same", "any"] = Field(
        default="same", description="co-location: only one user's jobs pair on a GPU "
        "(same), or any two users' (any; time-slice only: MPS is one user's)",
    )  # fmt: skip
    connect_timeout: str = Field(default="10s", description="SSH connect timeout")
    lost_after: str = Field(
        default="5m", description="an unreachable server's jobs are lost and requeued after this"
    )
    # -- Slurm nodes (a cluster, or one partition of it, planned as one node) -------------
    partition: str | None = Field(default=None, description="Slurm partition (sbatch -p)")
    account: str | None = Field(default=None, description="Slurm account (sbatch -A)")
    sbatch_args: list[str] = Field(
        default_factory=list, description="further sbatch options, e.g. ['--qos=green']"
    )
    time_margin: float = Field(
        default=0.25, ge=0, le=100, description="--time: the estimate plus this share, plus 5 min"
    )
    gpus_per_node: int | None = Field(default=None, ge=1, le=MAX_NODE_GPUS, description="GPUs "
                                      "per machine: a wider job gets sbatch --nodes N")  # fmt: skip
    slurm_bin_dir: Path | None = Field(
        default=None,
        description="where sbatch, squeue, sacct, scancel and scontrol are (absolute); "
        "default: /usr/local/sbin, /usr/local/bin, /usr/sbin, /usr/bin, /sbin, /bin",
    )

    # -- idle power and right-sizing (orchestrator.daemon.energy) -------------------------
    gpu_idle_w: float | None = Field(
        default=None,
        ge=0,
        le=MAX_GPU_IDLE_W,
        description="a GPU's draw without a job; default: measured while idle, else 50 W",
    )
    node_idle_w: float = Field(default=150.0, ge=0, le=100_000, description="the server's own "
                               "draw while on (CPUs, memory, fans); each idle GPU counts "
                               "its share")  # fmt: skip
    pue: float | None = Field(default=None, ge=1.0, le=5.0, description="default: [daemon] pue")
    idle_off_after: str | None = Field(
        default=None,
        description="power the server off once idle this long (needs power_off and power_on)",
    )
    power_off: list[str] | None = Field(default=None, description="argv, absolute program path; "
                                        "e.g. ipmitool ... power soft")  # fmt: skip
    power_on: list[str] | None = Field(
        default=None,
        description="argv, absolute program path; done once it exits 0 and the server answers",
    )
    power_timeout: str = Field(default="2m", description="a power command still running "
                               "after this is killed, and has failed")  # fmt: skip
    wake: str = Field(
        default="5m",
        description="how long the server takes to answer "
        "once woken (no job needing it within this is powered off)",
    )
    wake_timeout: str = Field(default="10m", description="a wake not answered by then has "
                              "failed (retried later)")  # fmt: skip

    @field_validator(
        "connect_timeout",
        "lost_after",
        "power_timeout",
        "wake",
        "wake_timeout",
        "idle_off_after",
        mode="after",
    )
    @classmethod
    def _durations(cls, value: str | None) -> str | None:
        return _duration(value)

    @field_validator("gpu_idle_w", "node_idle_w", "pue", mode="before")
    @classmethod
    def _numbers(cls, value: object) -> object:
        return _not_bool(value)

    @field_validator("power_off", "power_on", mode="after")
    @classmethod
    def _command(cls, value: list[str] | None) -> list[str] | None:
        """A power command is an argument list (no shell) whose program is an absolute
        path: the daemon's PATH never chooses what runs as root."""
        if value is None:
            return None
        if not value or len(value) > 64 or any(len(a) > 4096 or "\0" in a for a in value):
            raise ValueError("a power command is a list of 1 to 64 arguments (no NUL bytes)")
        if not value[0].startswith("/"):
            raise ValueError(f"{value[0]!r}: a power command's program must be an absolute path")
        return value

    @field_validator("name", mode="after")
    @classmethod
    def _printable_name(cls, value: str) -> str:
        if not value.isprintable() or value != value.strip():
            raise ValueError(f"node name {value!r}: no control characters or outer spaces")
        return value

    @model_validator(mode="after")
    def _islands(self) -> NodeConfig:
        """The declared NVLink islands are the node's topology: each GPU index in exactly
        one island; with a known count (gpus, fake_gpus), they cover 0 .. count-1."""
        if self.nvlink_islands is None:
            return self
        flat = [g for island in self.nvlink_islands for g in island]
        count = self.gpus if self.gpus is not None else self.fake_gpus
        if any(not island for island in self.nvlink_islands):
            raise ValueError(f"node {self.name}: nvlink_islands holds an empty island")
        if any(not 0 <= g < MAX_NODE_GPUS for g in flat):
            raise ValueError(f"node {self.name}: nvlink_islands: GPU indices are 0 and up")
        if len(set(flat)) != len(flat):
            raise ValueError(f"node {self.name}: nvlink_islands: a GPU appears in two islands")
        if count is not None and sorted(flat) != list(range(count)):
            raise ValueError(
                f"node {self.name}: nvlink_islands must hold each of its {count} GPUs "
                f"(0 to {count - 1}) once"
            )
        return self

    @model_validator(mode="after")
    def _ssh_needs_host(self) -> NodeConfig:
        if self.executor == "ssh" and not self.host:
            raise ValueError(f"node {self.name}: an ssh node needs a host")
        if self.executor == "slurm" and not self.gpus:
            raise ValueError(
                f"node {self.name}: a slurm node needs gpus (how many of the partition's GPUs "
                "gridshift plans with)"
            )
        if self.slurm_bin_dir is not None and not self.slurm_bin_dir.is_absolute():
            raise ValueError(f"node {self.name}: slurm_bin_dir must be an absolute path")
        if self.executor != "local" and self.fake_gpus is not None:
            raise ValueError(
                f"node {self.name}: fake_gpus is for local nodes; a server's GPUs are "
                "found through its nvidia-smi"
            )
        return self

    @model_validator(mode="after")
    def _share(self) -> NodeConfig:
        """Co-location as declared is co-location as done: no share a node never does."""
        if self.share != "never" and self.executor == "slurm":
            raise ValueError(f"node {self.name}: share is not for a Slurm node (its own GPU "
                             "sharing, gres/shard or MPS, is Slurm's to configure)")  # fmt: skip
        if self.share == "mps" and self.share_users == "any":
            raise ValueError(f"node {self.name}: share_users = \"any\" is for share = "
                             "\"time-slice\" (MPS serves one user's processes)")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _power(self) -> NodeConfig:
        """Right-sizing: SSH servers only, with both commands (Slurm's own power saving
        powers Slurm's machines; a local node is the daemon's own host)."""
        levers = [k for k in ("power_off", "power_on", "idle_off_after") if getattr(self, k)]
        if levers and self.executor != "ssh":
            where = (
                "the daemon's own host"
                if self.executor == "local"
                else (
                    "a Slurm node: Slurm's own power saving (SuspendProgram, SuspendTime) does it"
                )
            )
            raise ValueError(f"node {self.name}: {levers[0]} is for SSH servers, not {where}")
        if levers and not (self.power_off and self.power_on):
            raise ValueError(f"node {self.name}: right-sizing needs both power_off and power_on")
        idle = [k for k in ("gpu_idle_w", "node_idle_w", "pue") if k in self.model_fields_set]
        if idle and self.executor == "slurm":
            raise ValueError(f"node {self.name}: {idle[0]} is not counted on a Slurm node "
                             "(its idle machines are Slurm's business)")  # fmt: skip
        if levers and self.seconds("wake_timeout") < self.seconds("wake"):
            raise ValueError(f"node {self.name}: wake_timeout {self.wake_timeout} is shorter "
                             f"than wake {self.wake}: every wake would fail")  # fmt: skip
        if levers and self.seconds("power_timeout") > self.seconds("wake_timeout"):
            raise ValueError(f"node {self.name}: power_timeout {self.power_timeout} is longer "
                             f"than wake_timeout {self.wake_timeout}")  # fmt: skip
        from orchestrator.settings.trust import unrunnable, untrusted

        for key in ("power_off", "power_on") if levers else ():
            program = getattr(self, key)[0]
            if (why := untrusted(program) or unrunnable(program)) is not None:
                raise ValueError(f"node {self.name}: {key} {program!r}: {why}")
        return self

    def seconds(self, name: str) -> float:
        from orchestrator.timeparse import parse_duration_s

        return parse_duration_s(getattr(self, name))
