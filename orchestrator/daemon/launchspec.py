"""What the executor is handed to start an attempt: the command, its environment (the
submitter's, plus the GPUs and the job's identity), its files, its GPU backend and, on
Slurm, its begin time and time limit."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from pathlib import Path

from executors.base import LaunchSpec
from executors.gang import part_dir
from orchestrator.nodes.backends import FAKE_GPU_STATE
from orchestrator.nodes.inventory import ResolvedNode
from orchestrator.queue.attempts import parts_of
from orchestrator.queue.models import Attempt, Job
from orchestrator.settings import Settings

MASTER_PORT_BASE = 20000  # rank 0 listens on this plus the attempt's id modulo 10,000


def gpu_list(gpus: list[int]) -> str:
    return ",".join(str(g) for g in gpus)


def time_limit_s(job: Job, att: Attempt, node: ResolvedNode, left_s: float | None) -> float | None:
    """The model's estimate of the run time left (``left_s`` at full width and power), at
    this width and cap, plus the node's margin and 5 minutes; None (the partition's
    default) when unknown."""
    if not job.duration_s or left_s is None:
        return None
    width = max(1, len(att.gpu_ids))
    slower = max(1.0, (job.gpus_max or width) / width) / (att.cap or 1.0)
    margin = node.config.time_margin if node.config is not None else 0.25
    return left_s * slower * (1 + margin) + 300.0


def launch_spec(
    settings: Settings,
    job: Job,
    att: Attempt,
    node: ResolvedNode,
    *,
    left_s: float | None = None,
    log_gid: int | None = None,
    power_sample_s: float | None = None,
    begin_at: datetime | None = None,
) -> LaunchSpec:
    env = dict(job.env)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": gpu_list(att.gpu_ids),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # NVML's order, as placement uses
            "GRIDSHIFT_JOB_ID": str(job.id),
            # unique to the job, the same for each of its attempts: ids never come back
            # after ``clean``, but a new database starts them at 1: the submission time differs
            "GRIDSHIFT_JOB_KEY": f"{job.id}-{round(job.submitted_at.timestamp() * 1e6)}",
            "GRIDSHIFT_JOB_NAME": job.name or "",
            # its width this attempt: an elastic job (--gpus 2-8) may be resized between
            # attempts (checkpoint, relaunch), and learns its width here
            "GRIDSHIFT_GPUS": str(len(att.gpu_ids)),
        }
    )
    remote = node.executor != "local"
    begin_iso = limit_s = None
    machines = 1
    if node.executor == "slurm":  # Slurm picks the GPUs and sets CUDA_VISIBLE_DEVICES
        env.pop("CUDA_VISIBLE_DEVICES")
        limit_s = time_limit_s(job, att, node, left_s)
        begin_iso = begin_at.isoformat() if begin_at else None
        machines = slurm_machines(len(att.gpu_ids), node.config)
        if machines > 1:  # the rest of the rendezvous comes from Slurm on each machine
            env |= {"MASTER_PORT": str(MASTER_PORT_BASE + att.id % 10000),
                    "NNODES": str(machines), "WORLD_SIZE": str(len(att.gpu_ids))}  # fmt: skip
    if node.fake:
        power = settings.fake_gpu_power_w
        state = settings.home / FAKE_GPU_STATE
        backend = f"fake:{power}@{state}" if power else f"fake:@{state}"
    else:
        backend = {"nvml": "nvml", "nvidia-smi": "smi"}.get(node.gpu_source, "none")
    return LaunchSpec(
        job_id=job.id,
        attempt_id=att.id,
        command=list(job.command),
        workdir=job.workdir,
        env=env,
        gpu_indices=list(att.gpu_ids),
        log_path=str(settings.log_path(job.id)),
        run_dir=att.run_dir,
        # the submitter (None: the daemon's user): Slurm submits as them, an SSH node
        # maps them to an account (``user = "{user}"``) or runs all as its one account
        run_as_uid=att.run_as_uid,
        log_gid=None if remote else log_gid,
        gpu_backend=backend,
        power_sample_s=power_sample_s,
        node=node.name,
        begin_at=begin_iso,
        time_limit_s=limit_s,
        interruptible=job.interruptible,
        nodes=machines,
    )


def part_log_path(log_path: str, job_id: int, rank: int) -> str:
    """The log of a job across servers' part: rank 0's is the job's own log; each other
    part's is ``<job>.part-<rank>.log`` beside it (servers sharing a home do not append
    to one file)."""
    return log_path if rank == 0 else str(Path(log_path).with_name(f"{job_id}.part-{rank}.log"))


def slurm_machines(gpus: int, config) -> int:
    """Machines a Slurm job of ``gpus`` GPUs runs on: one, unless the node declares its
    machines' ``gpus_per_node`` and the job is wider (then as few as carry it)."""
    per = getattr(config, "gpus_per_node", None)
    return 1 if not per or gpus <= per else -(-gpus // per)


def part_specs(
    settings: Settings,
    job: Job,
    att: Attempt,
    nodes: list[ResolvedNode],
    *,
    power_sample_s: float | None = None,
) -> list[LaunchSpec]:
    """One spec per part of a job across servers (``nodes``: each part's, rank order):
    its node's GPUs, and the rendezvous ``torchrun`` and ``torch.distributed`` read:
    ``MASTER_ADDR`` (rank 0's ``rendezvous_addr``, else its host), ``MASTER_PORT``,
    ``NNODES`` (servers), ``NODE_RANK``, ``NPROC_PER_NODE`` (this server's GPUs) and
    ``WORLD_SIZE`` (every GPU of the job: one process per GPU)."""
    parts = parts_of(att)
    master = nodes[0]
    addr = master.config.rendezvous_addr if master.config is not None else None
    rendezvous = {
        "MASTER_ADDR": addr or master.host or master.name,
        "MASTER_PORT": str(MASTER_PORT_BASE + att.id % 10000),
        "NNODES": str(len(parts)),
        "WORLD_SIZE": str(sum(len(gpus) for _, gpus in parts)),
    }
    out = []
    for rank, ((name, gpus), node) in enumerate(zip(parts, nodes, strict=True)):
        spec = launch_spec(settings, job, att, node, power_sample_s=power_sample_s)
        env = {
            **spec.env,
            **rendezvous,
            "CUDA_VISIBLE_DEVICES": gpu_list(gpus),
            "NODE_RANK": str(rank),
            "NPROC_PER_NODE": str(len(gpus)),
        }
        log_path = spec.log_path if rank == 0 else part_log_path(spec.log_path, job.id, rank)
        out.append(replace(spec, env=env, gpu_indices=list(gpus), node=name, log_path=log_path,
                           run_dir=part_dir(att.run_dir, rank)))  # fmt: skip
    return out
