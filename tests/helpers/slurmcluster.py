"""A real single-node Slurm cluster for the tests: Debian's munged, slurmctld and slurmd
(and slurmdbd on a private MariaDB, so that ``sacct`` answers), started as root on
127.0.0.1 with every file in one temporary directory. The node declares GPUs as GRES
backed by plain files. Slurm's commands find it through ``SLURM_CONF``."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.helpers.waiting import free_port

SBIN = Path("/usr/sbin")
NEEDED = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "sacct", "scancel", "scontrol")


def slurm_missing() -> str | None:
    """Why no test cluster can start here, or None."""
    missing = [n for n in NEEDED if not (SBIN / n).exists()]
    missing += [n for n in CLIENTS if shutil.which(n) is None]
    if missing:
        return (
            f"Slurm is not installed (missing {', '.join(missing)}; Debian: apt-get install "
            "slurmctld slurmd slurm-client munge)"
        )
    if os.geteuid() != 0:
        return "the test Slurm cluster runs its daemons as root"
    return None


def accounting_missing() -> str | None:
    if not (SBIN / "slurmdbd").exists():
        return "slurmdbd is not installed (Debian: apt-get install slurmdbd mariadb-server)"
    if not (SBIN / "mariadbd").exists() and not (SBIN / "mysqld").exists():
        return "MariaDB is not installed (Debian: apt-get install mariadb-server)"
    return None


def _wait_port(port: int, proc: subprocess.Popen, log: Path, what: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise RuntimeError(f"{what} did not start:\n{tail}")
        time.sleep(0.1)


class SlurmCluster:
    def __init__(self, gpus: int = 4, *, accounting: bool = True, energy: bool = False):
        self.gpus = gpus
        self.accounting = accounting
        self.dir = Path(tempfile.mkdtemp(prefix="gridshift-slurm-"))
        os.chmod(self.dir, 0o755)
        self.node = socket.gethostname()
        self.procs: list[subprocess.Popen] = []
        self.conf = self.dir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- the pieces -----------------------------------------------------------------------
    def _munge(self) -> None:
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = self.dir / "munge.sock"
        self._start(
            [str(SBIN / "munged"), "--foreground", "--force", f"--key-file={key}",
             f"--socket={self.munge_socket}", f"--pid-file={self.dir / 'munged.pid'}",
             f"--log-file={self.dir / 'munged.log'}", f"--seed-file={self.dir / 'munge.seed'}"],
            "munged",
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("munged did not start")
            time.sleep(0.05)

    def _mariadb(self) -> None:
        data, self.mysql_socket = self.dir / "mysql", self.dir / "mysql.sock"
        install = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
        proc = subprocess.run(
            [install, "--user=root", f"--datadir={data}", "--skip-test-db",
             "--auth-root-authentication-method=normal"], capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {proc.stderr[-1500:]}")
        server = SBIN / "mariadbd" if (SBIN / "mariadbd").exists() else SBIN / "mysqld"
        self.mysql_port = free_port()
        log = self.dir / "mysql.log"
        proc = self._start(
            [str(server), "--no-defaults", "--user=root", f"--datadir={data}",
             f"--socket={self.mysql_socket}", f"--port={self.mysql_port}",
             "--bind-address=127.0.0.1", f"--log-error={log}", f"--pid-file={self.dir}/my.pid",
             "--innodb-flush-log-at-trx-commit=0", "--skip-log-bin"],
            "mysqld",
        )  # fmt: skip
        _wait_port(self.mysql_port, proc, log, "MariaDB")

    def _slurmdbd(self) -> None:
        self.dbd_port = free_port()
        conf = self.dir / "slurmdbd.conf"
        conf.write_text(
            "\n".join([
                "AuthType=auth/munge", f"AuthInfo=socket={self.munge_socket}",
                "DbdHost=localhost", "DbdAddr=127.0.0.1", f"DbdPort={self.dbd_port}",
                "SlurmUser=root", f"LogFile={self.dir}/slurmdbd.log",
                f"PidFile={self.dir}/slurmdbd.pid", "StorageType=accounting_storage/mysql",
                "StorageHost=127.0.0.1", f"StoragePort={self.mysql_port}",
                "StorageUser=root", "StorageLoc=slurm_acct_db", "DebugLevel=info",
            ]) + "\n"
        )  # fmt: skip
        conf.chmod(0o600)
        log = self.dir / "slurmdbd.log"
        proc = self._start([str(SBIN / "slurmdbd"), "-D"], "slurmdbd")  # conf: beside SLURM_CONF
        _wait_port(self.dbd_port, proc, log, "slurmdbd")

    def _slurm_conf(self) -> None:
        self.ctld_port, self.slurmd_port = free_port(), free_port()
        for i in range(self.gpus):
            (self.dir / f"gpu{i}").touch()
        d = self.dir
        gres_files = f"{d}/gpu[0-{self.gpus - 1}]" if self.gpus > 1 else f"{d}/gpu0"
        (d / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={gres_files}\n")
        lines = [
            "ClusterName=gridshift", f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}", f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}", "CredType=cred/munge",
            f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool",
            f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/slurmd.pid",
            f"SlurmctldLogFile={d}/slurmctld.log", f"SlurmdLogFile={d}/slurmd.log",
            "ProctrackType=proctrack/pgid", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1,bf_interval=1,sched_min_interval=100000",
            "GresTypes=gpu", "ReturnToService=2", "MinJobAge=600", "KillWait=5",
            "JobAcctGatherType=jobacct_gather/linux", "JobAcctGatherFrequency=1",
            "MpiDefault=none", "SlurmctldTimeout=30", "SlurmdTimeout=60",
            "InactiveLimit=0", "Waittime=0", "SlurmctldDebug=info", "SlurmdDebug=info",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 2} "
            f"Gres=gpu:{self.gpus} State=UNKNOWN",
            "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=FORCE:8",
        ]  # fmt: skip
        if self.accounting:
            lines += [
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1", f"AccountingStoragePort={self.dbd_port}",
                f"AccountingStoragePass={self.munge_socket}",  # munge: the socket
                "AccountingStorageTRES=gres/gpu",
            ]  # fmt: skip
        else:
            lines.append("AccountingStorageType=accounting_storage/none")
        self.conf.write_text("\n".join(lines) + "\n")
        (d / "state").mkdir()
        (d / "spool").mkdir()

    def _start(self, argv: list[str], name: str) -> subprocess.Popen:
        with open(self.dir / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=self.dir)  # fmt: skip
        self.procs.append(proc)
        return proc

    # -- life -----------------------------------------------------------------------------
    def start(self) -> SlurmCluster:
        try:
            self._munge()
            if self.accounting:
                self._mariadb()
                self._slurmdbd()
            self._slurm_conf()
            ctld = self._start([str(SBIN / "slurmctld"), "-D", "-i", "-f", str(self.conf)],
                               "slurmctld")  # fmt: skip
            _wait_port(self.ctld_port, ctld, self.dir / "slurmctld.log", "slurmctld")
            slurmd = self._start([str(SBIN / "slurmd"), "-D", "-f", str(self.conf)], "slurmd")
            self._wait_idle(slurmd)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_idle(self, slurmd: subprocess.Popen, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            state = self.cmd("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()
            if state in ("idle", "mixed", "allocated"):
                return
            if state.startswith("down") or state.startswith("drain"):
                self.cmd("scontrol", "update", f"NodeName={self.node}", "State=RESUME",
                         check=False)  # fmt: skip
            if slurmd.poll() is not None or time.monotonic() > deadline:
                log = (self.dir / "slurmd.log").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"the Slurm node did not come up ({state!r}):\n{log}")
            time.sleep(0.2)

    def cmd(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if not os.environ.get("GRIDSHIFT_KEEP_TEST_SERVERS"):
            shutil.rmtree(self.dir, ignore_errors=True)
