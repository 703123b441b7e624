"""The lab's SSH servers as the daemon sees them: one ``SshLink`` per ``[[nodes]]`` table
with ``executor = "ssh"``, their GPUs discovered through ``nvidia-smi`` (all servers at
once), the discovery stored for ``gridshift nodes``, and their power caps. The links'
control sockets live in ``$GRIDSHIFT_HOME/ssh/`` when this process owns the home (the
daemon), else in ``$XDG_RUNTIME_DIR/gridshift-<hash>`` or a private temporary directory."""

from __future__ import annotations

import hashlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from sqlmodel import Session, select

from executors.errors import ExecutorError, GpuControlError
from executors.gpu.smi import GpuStatus, SmiGpuControl, gpu_status
from executors.sshlink import (
    MAX_CONTROL_PATH,
    SOCKET_NAME_LEN,
    RemoteError,
    SshLink,
    SshTarget,
    private_control_dir,
)
from orchestrator.queue.models import Gpu, Node
from orchestrator.settings import NodeConfig

log = logging.getLogger(__name__)

LIVE_FIELDS = (
    "memory_used_mb",
    "utilization_pct",
    "power_draw_w",
    "power_limit_w",
    "power_default_w",
    "power_min_w",
    "power_max_w",
)
# what a discovery found: the GPUs, or why the server could not say
Discovery = dict[str, list[GpuStatus] | str]


def ssh_target(cfg: NodeConfig) -> SshTarget:
    return SshTarget(
        node=cfg.name,
        host=cfg.host or cfg.name,
        port=cfg.port,
        user=cfg.user,
        identity_file=str(cfg.identity_file.expanduser()) if cfg.identity_file else None,
        known_hosts=str(cfg.known_hosts.expanduser()) if cfg.known_hosts else None,
        verify_host_key=cfg.verify_host_key,
        python=cfg.python,
        remote_dir=cfg.remote_dir,
        sudo=cfg.sudo,
        connect_timeout_s=cfg.seconds("connect_timeout"),
    )


def control_dir(home: Path | None) -> Path:
    """Where this process keeps its SSH master sockets: the home's ``ssh/`` when this
    process owns the home and the path is short enough for a socket, else
    ``$XDG_RUNTIME_DIR/gridshift-<hash of the home>``, else a private temporary one.
    Whichever it is, each link checks it (owner, 0700, no symlink) before every use."""

    def fits(path: Path) -> bool:
        return len(str(path)) + 1 + SOCKET_NAME_LEN <= MAX_CONTROL_PATH

    if home is not None:
        try:
            own = os.lstat(home).st_uid == os.geteuid()
        except OSError:
            own = False
        if own and fits(home / "ssh"):
            return home / "ssh"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        tag = hashlib.sha256(str(home).encode()).hexdigest()[:8]
        path = Path(runtime) / f"gridshift-{tag}"
        if fits(path):
            return path
    return private_control_dir()


def build_links(configs: list[NodeConfig], home: Path | None = None) -> dict[str, SshLink]:
    where = control_dir(home)
    return {
        c.name: SshLink(ssh_target(c), control_dir=where) for c in configs if c.executor == "ssh"
    }


def shared_account(cfg: NodeConfig) -> bool | None:
    """Whether every user's jobs run as one account on this node (one trust domain:
    each job can read, signal and forge the files of the others there). None: not an
    SSH node."""
    if cfg.executor != "ssh":
        return None
    return "{user}" not in (cfg.user or "")


def smi_runner(link: SshLink):
    """``nvidia-smi`` on the server: its failures are GPU control errors; an unreachable
    server stays ``HostUnreachable`` (the daemon retries, it does not fail a job)."""

    def run(argv: list[str]) -> str:
        try:
            return link.text(argv)
        except RemoteError as exc:
            raise GpuControlError(str(exc)) from None

    return run


def discover(links: dict[str, SshLink]) -> Discovery:
    """Every server's GPUs, asked all at once."""
    if not links:
        return {}

    def one(link: SshLink) -> list[GpuStatus] | str:
        try:
            return gpu_status(smi_runner(link))
        except (ExecutorError, GpuControlError) as exc:
            return str(exc)

    with ThreadPoolExecutor(len(links), thread_name_prefix="discover") as pool:
        found = dict(zip(links, pool.map(one, links.values()), strict=True))
    for node, got in found.items():
        if isinstance(got, str):
            log.warning("node %s: GPU discovery failed: %s", node, got)
    return found


def stored_gpus(session: Session, node: str) -> list[GpuStatus]:
    """What the last discovery of ``node`` stored (for a server that is down at start)."""
    rows = session.exec(select(Gpu).where(Gpu.node == node).order_by(Gpu.index)).all()
    keep = ("power_limit_w", "power_default_w", "power_min_w", "power_max_w")
    unknown = dict.fromkeys(("memory_used_mb", "utilization_pct", "power_draw_w"))
    return [
        GpuStatus(
            g.index, g.uuid, g.model, g.memory_mb, **unknown, **{k: getattr(g, k) for k in keep}
        )
        for g in rows
    ]


def record(session: Session, found: Discovery, now: datetime) -> None:
    """Store what each server said (or why it said nothing) on its node and GPU rows."""
    for name, got in found.items():
        node = session.get(Node, name)
        if node is None:
            continue
        if isinstance(got, str):
            node.reachable, node.error = False, got
            session.add(node)
            continue
        node.reachable, node.error, node.last_seen = True, None, now
        session.add(node)
        for status in got:
            gpu = session.get(Gpu, (name, status.index))
            if gpu is None:
                continue
            for key in LIVE_FIELDS:
                setattr(gpu, key, getattr(status, key))
            session.add(gpu)


def gpu_control(link: SshLink) -> SmiGpuControl:
    return SmiGpuControl(smi_runner(link), sudo=link.target.sudo)
