"""A real OpenSSH server (Debian's ``openssh-server``) for tests: a separate ``sshd``
process on 127.0.0.1 at a free port, with a throwaway host key, the test's user key, and
a fake ``nvidia-smi`` (``fake_nvidia_smi.py``) first on its sessions' PATH.

``stop()`` kills the listener and every session it forked, as a server going off the
network does; jobs already started there (in sessions of their own) keep running, and
``start()`` brings the same server back on the same port with the same host key.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers.waiting import free_port

SSHD = "/usr/sbin/sshd"
HELPERS = Path(__file__).resolve().parent


def sshd_missing() -> str | None:
    """Why no test sshd can run here, or None."""
    if not Path(SSHD).exists():
        return (
            "openssh-server is not installed (.ci/run installs it: apt-get install openssh-server)"
        )
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "the OpenSSH client is not installed"
    return None


def keygen(path: Path) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


class SshServer:
    def __init__(self, root: Path, user_key: Path, gpus: int = 4, power_w: float = 250.0,
                 smi_flags: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.user_key = user_key
        self.gpus = gpus
        self.port = free_port()
        self.host_key = keygen(root / "host_key")
        self.gpu_state = root / "gpus.json"
        bin_dir = root / "bin"
        bin_dir.mkdir(exist_ok=True)
        smi = bin_dir / "nvidia-smi"
        flags = " ".join(smi_flags)
        smi.write_text(
            f"#!/bin/sh\nexec {sys.executable} {HELPERS / 'fake_nvidia_smi.py'} "
            f'--state {self.gpu_state} --count {gpus} --power {power_w} {flags} "$@"\n'
        )
        smi.chmod(0o755)
        path = f"{bin_dir}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
        self.config = root / "sshd_config"
        self.config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.host_key}",
                    f"PidFile {root / 'sshd.pid'}",
                    f"AuthorizedKeysFile {user_key}.pub",
                    "StrictModes no",
                    "UsePAM no",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    f"SetEnv PATH={path}",
                    "MaxSessions 50",
                    "MaxStartups 50:30:100",
                    "LogLevel ERROR",
                    "",
                ]
            )
        )
        self.proc: subprocess.Popen | None = None

    @property
    def user(self) -> str:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name

    def known_hosts_line(self) -> str:
        key = " ".join(Path(f"{self.host_key}.pub").read_text().split()[:2])
        return f"[127.0.0.1]:{self.port} {key}\n"

    def node(self, name: str, known_hosts: Path, **extra) -> dict:
        """A ``[[nodes]]`` table for this server."""
        return {
            "name": name,
            "executor": "ssh",
            "host": "127.0.0.1",
            "port": self.port,
            "user": self.user,
            "identity_file": str(self.user_key),
            "known_hosts": str(known_hosts),
            "remote_dir": str(self.root / "home"),
            **extra,
        }

    def start(self, timeout_s: float = 10.0) -> SshServer:
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "sshd.log", "ab"),  # noqa: SIM115 - the child keeps it
        )
        deadline = time.monotonic() + timeout_s
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5),
            ):
                return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = (self.root / "sshd.log").read_text(errors="replace")
                raise RuntimeError(f"sshd did not start: {log[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        """The listener and all its sessions, at once (SIGKILL)."""
        if self.proc is None:
            return
        for pid in [*_descendants(self.proc.pid), self.proc.pid]:
            if _comm(pid) == "sshd":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def freeze(self, sig: int = signal.SIGSTOP) -> None:
        """A server that hangs: its sshd processes stop answering (SIGCONT: ``thaw``)."""
        assert self.proc is not None
        for pid in [self.proc.pid, *_descendants(self.proc.pid)]:
            if _comm(pid) == "sshd":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    def thaw(self) -> None:
        self.freeze(signal.SIGCONT)

    def pl_calls(self) -> list[str]:
        path = Path(f"{self.gpu_state}.calls")
        return path.read_text().splitlines() if path.exists() else []


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
