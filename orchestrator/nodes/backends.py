"""The factories that name concrete backends: the executors behind the nodes (local, SSH,
Slurm, and the router over them), the GPU controls (NVML, fakes, ``nvidia-smi`` over
SSH) and the power caps built on them. The daemon, ``plan --submit`` and ``show`` ask
here; nothing else in ``orchestrator`` imports a backend."""

from __future__ import annotations

import hashlib

from executors.base import Executor
from executors.errors import GpuControlError
from executors.gpu import GpuControl
from executors.local import LocalExecutor
from orchestrator.errors import ConfigError
from orchestrator.nodes import ssh as sshnodes
from orchestrator.nodes.inventory import ResolvedNode
from orchestrator.nodes.powercaps import ClusterCaps, PowerCaps
from orchestrator.settings import Settings

FAKE_GPU_STATE = "fake-gpus.json"  # the fake GPUs' power limits, under GRIDSHIFT_HOME


def local_executor() -> Executor:
    return LocalExecutor()


def slurm_executors(settings: Settings, safe_url: str) -> dict[str, Executor]:
    """One Slurm executor per ``executor = "slurm"`` node. Its jobs are named after this
    queue (``gs<hash of the database>-a<attempt>``), so two queues can share a cluster."""
    from executors.slurm import SlurmExecutor
    from executors.slurm import commands as slurmcmd

    slurm = [cfg for cfg in settings.nodes if cfg.executor == "slurm"]
    for cfg in slurm:
        bin_dir = str(cfg.slurm_bin_dir) if cfg.slurm_bin_dir else None
        if "sbatch" in slurmcmd.missing(bin_dir):
            where = bin_dir or ", ".join(slurmcmd.SEARCH_DIRS)
            raise ConfigError(
                f"node {cfg.name}: executor 'slurm' needs Slurm's client commands (sbatch, "
                f"squeue, sacct, scancel, scontrol) in {where} (slurm_bin_dir sets where)"
            )
    prefix = "gs" + hashlib.sha1(safe_url.encode()).hexdigest()[:8]
    return {
        cfg.name: SlurmExecutor(
            node=cfg.name,
            prefix=prefix,
            partition=cfg.partition,
            account=cfg.account,
            extra_args=cfg.sbatch_args,
            bin_dir=str(cfg.slurm_bin_dir) if cfg.slurm_bin_dir else None,
        )
        for cfg in slurm
    }


def route(by_node: dict[str, Executor], default: Executor) -> Executor:
    """One executor over the nodes: ``default`` alone, or a router to each node's."""
    if not by_node:
        return default
    from executors.router import NodeRouter

    return NodeRouter(by_node, default=default)


def build_executor(settings: Settings, links: dict, safe_url: str, default: Executor) -> Executor:
    """The daemon's executor: SSH servers, Slurm nodes and this host behind one router."""
    by_node: dict[str, Executor] = {}
    if links:
        from executors.ssh import SshExecutor

        by_node.update(dict.fromkeys(links, SshExecutor(links)))
    by_node.update(slurm_executors(settings, safe_url))
    return route(by_node, default)


def slurm_job(job_id: str, settings: Settings | None = None):
    """What Slurm says of one of its jobs (``show``; squeue, then sacct), or None."""
    from executors.slurm import SlurmExecutor

    dirs = [c.slurm_bin_dir for c in (settings.nodes if settings else []) if c.slurm_bin_dir]
    return SlurmExecutor(bin_dir=str(dirs[0]) if dirs else None).lookup(job_id)


def local_gpu_control(
    settings: Settings, nodes: list[ResolvedNode]
) -> tuple[GpuControl | None, int]:
    """This host's GPU control (the local nodes'), and how many GPUs it has."""
    local = [n for n in nodes if n.executor == "local" and n.gpu_count]
    if not local:
        return None, 0
    count = max(n.gpu_count for n in local)
    if any(n.fake for n in local):
        from executors.gpu.fake import FakeGpuControl

        state = settings.home / FAKE_GPU_STATE
        return FakeGpuControl(count, power_w=settings.fake_gpu_power_w, state_path=state), count
    try:
        from executors.gpu.nvml import NvmlGpuControl

        return NvmlGpuControl(), count
    except GpuControlError:
        return None, count


def cluster_caps(
    settings: Settings, nodes: list[ResolvedNode], links: dict, wanted: bool
) -> ClusterCaps:
    """Power caps per node: this host's GPUs through NVML (or fakes), SSH servers' through
    ``nvidia-smi``; Slurm nodes have none."""
    by_node: dict[str, PowerCaps] = {}
    local = PowerCaps(*local_gpu_control(settings, nodes), wanted=wanted)
    for n in nodes:
        if n.executor == "local":
            by_node[n.name] = local
        elif n.name in links and n.gpu_count:
            ctl = sshnodes.gpu_control(links[n.name])
            by_node[n.name] = PowerCaps(ctl, n.gpu_count, wanted=wanted)
    return ClusterCaps(by_node)
