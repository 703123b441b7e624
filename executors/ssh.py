"""The SSH executor: jobs on the lab's GPU servers, one ``SshLink`` per node.

A job runs on its server under the same monitor local jobs use (``executors.shim``,
shipped by ``executors.bundle``), started by the ``launch`` verb in a session of its own:
it outlives the SSH connection, writes the job's pid, log, exit code and energy samples
in its run directory there, and the claim protocol settles an interrupted launch exactly
as it does locally.

The daemon asks every server with running attempts for their state at the start of each
pass, all servers at the same time (``refresh``), and waits for answers at most
``poll_wait_s``: a slow server's attempts read ``UNREACHABLE`` for that pass and its
request goes on in the background. Each answer is mirrored into the attempt's local run
directory (``job.json`` and the new lines of ``power.log``), so accounting reads a remote
attempt as it reads a local one. Every answer is checked (``sshanswers``) before use: a
malformed one makes its node erroring for the pass, as if it were down.

Accounts: on a node whose ``user`` is ``"{user}"`` a job logs in as its submitter (the
launch spec's ``run_as_uid``; None is the daemon's own user), one master connection per
(server, account); the account is kept in the handle and in ``ssh.json`` in the local run
directory (for recovery). Elsewhere every job runs as the node's one account: its jobs
share one trust domain there.
"""

from __future__ import annotations

import logging
import os
import pwd
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

from executors import runfiles
from executors.base import Executor, Handle, LaunchSpec, PollResult, RunStatus
from executors.errors import ExecutorError, LaunchError
from executors.local import poll_result
from executors.sshlink import HostUnreachable, SshLink

RECORD = "ssh.json"  # in the local run directory: the node and account of the attempt

log = logging.getLogger(__name__)


class SshExecutor(Executor):
    name = "ssh"

    def __init__(self, links: dict[str, SshLink], poll_wait_s: float = 2.0) -> None:
        self.links = links
        self.poll_wait_s = poll_wait_s
        self._pool = ThreadPoolExecutor(max(1, len(links)), thread_name_prefix="ssh")
        self._inflight: dict[str, Future] = {}
        # by (attempt, node): the parts of a job across servers share their attempt
        self._answers: dict[tuple, dict] = {}  # the server's latest answer
        self._fresh: set[tuple] = set()  # answered since the last refresh began
        self._offsets: dict[tuple, int] = {}  # bytes of each power log mirrored so far
        self._accounts: dict[tuple[str, str], SshLink] = {}  # {user} nodes' other accounts
        self._accounts_lock = threading.Lock()

    def _link(self, node: str | None, account: str | None = None) -> SshLink:
        """The node's link as ``account`` (None: the node's own account)."""
        link = self.links.get(node or "")
        if link is None:
            raise ExecutorError(f"node {node!r} is not an SSH node")
        if account is None or not link.template.per_user or account == link.target.user:
            return link
        with self._accounts_lock:
            key = (node, account)
            if key not in self._accounts:
                self._accounts[key] = link.for_account(account)
            return self._accounts[key]

    def _handle_link(self, handle: Handle) -> SshLink:
        node = handle.data.get("node")
        account = handle.data.get("account")
        if account is None:  # an attempt whose launch never answered: its record
            record = runfiles.read_json(Path(handle.run_dir) / RECORD) or {}
            account = record.get("account") if isinstance(record, dict) else None
        return self._link(node, account if isinstance(account, str) else None)

    def account_of(self, node: str | None, run_as_uid: int | None) -> str | None:
        """The account a job of ``run_as_uid`` logs in as on ``node``: its submitter's
        name on a ``{user}`` node, else None (the node's one account)."""
        if not self._link(node).template.per_user:
            return None
        uid = os.geteuid() if run_as_uid is None else run_as_uid
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            raise LaunchError(f"uid {uid} has no name here to log in to {node} with") from None

    # -- launch -------------------------------------------------------------------------
    def _do_launch(self, spec: LaunchSpec) -> Handle:
        account = self.account_of(spec.node, spec.run_as_uid)
        link = self._link(spec.node, account)
        t = link.target
        remote = {
            **spec.to_dict(),
            "log_path": t.remote_path("logs", Path(spec.log_path).name),
            "run_dir": t.remote_path("run", _remote_name(spec.attempt_id, spec.run_dir)),
            "run_as_uid": None,  # a server runs jobs as the account they log in as
            "run_as_gid": None,
            "log_gid": None,
        }
        local = Path(spec.run_dir)
        try:
            local.mkdir(parents=True, exist_ok=True)
            runfiles.write_json(local / RECORD, {"node": spec.node, "account": account})
        except OSError as exc:
            raise LaunchError(f"cannot write {local}: {exc}") from exc
        try:
            answer = link.verb("launch", request={"spec": remote})
        except HostUnreachable:
            raise
        except ExecutorError as exc:
            raise LaunchError(str(exc)) from exc
        data = {
            "node": spec.node,
            "remote_run_dir": answer["run_dir"],
            "log_path": answer["log_path"],
            "monitor": answer["monitor"],
        }
        if account is not None:
            data["account"] = account
        return Handle(attempt_id=spec.attempt_id, run_dir=str(local), data=data)

    # -- state --------------------------------------------------------------------------
    def refresh(self, handles: list[Handle]) -> None:
        """Ask each server about its attempts (all servers at once), and retry servers
        that are down when their retry is due, so one that is back is used again."""
        self._fresh.clear()
        keep = {_key(h) for h in handles}  # attempts no longer asked about are gone
        self._answers = {a: v for a, v in self._answers.items() if a in keep}
        self._offsets = {a: v for a, v in self._offsets.items() if a in keep}
        by_link: dict[tuple, list[Handle]] = {(n, None): [] for n in self.links}
        for h in handles:
            by_link.setdefault((h.data.get("node"), h.data.get("account")), []).append(h)
        for key, hs in by_link.items():
            try:
                link = self._link(*key)
            except ExecutorError:  # not an SSH node, or not an account
                continue
            if key in self._inflight or not link.retry_due():
                continue
            if hs:
                self._inflight[key] = self._pool.submit(self._status, link, hs)
            elif not link.up:
                self._inflight[key] = self._pool.submit(link.run, ["true"])
        self._collect(self.poll_wait_s)

    def _collect(self, wait_s: float) -> None:
        if self._inflight:
            wait(list(self._inflight.values()), timeout=wait_s)
        for key, fut in list(self._inflight.items()):
            if not fut.done():
                continue
            del self._inflight[key]
            try:
                answers = fut.result()
            except ExecutorError as exc:
                log.debug("node %s: %s", key[0], exc)
                continue
            if isinstance(answers, dict):
                for handle, answer in answers.values():
                    self._take(handle, answer)

    def _status(self, link: SshLink, handles: list[Handle]) -> dict[tuple, tuple[Handle, dict]]:
        request = {
            "runs": [
                {
                    "run_dir": h.data["remote_run_dir"],
                    "monitor": h.data["monitor"],
                    "power_offset": self._mirrored(h),
                }
                for h in handles
            ]
        }
        runs = link.verb("status", request=request)["runs"]
        if len(runs) != len(handles):
            raise link.bad_answer("status", f"{len(runs)} runs for {len(handles)} asked")
        return {_key(h): (h, run) for h, run in zip(handles, runs, strict=True)}

    def _mirrored(self, handle: Handle) -> int:
        """Bytes of the power log mirrored so far (a restarted daemon: what its
        predecessor mirrored, whole lines in order)."""
        if _key(handle) not in self._offsets:
            path = Path(handle.run_dir) / runfiles.POWER
            self._offsets[_key(handle)] = path.stat().st_size if path.exists() else 0
        return self._offsets[_key(handle)]

    def _take(self, handle: Handle, answer: dict) -> None:
        """Keep the answer and mirror what accounting reads (power log before job.json,
        as the monitor writes them)."""
        local = Path(handle.run_dir)
        try:
            local.mkdir(parents=True, exist_ok=True)
            power = local / runfiles.POWER
            if answer["power_exists"]:
                with open(power, "a") as fh:
                    fh.write(answer["power"])
                self._offsets[_key(handle)] = self._offsets.get(_key(handle), 0) + len(
                    answer["power"].encode()
                )
            if answer["job"] and not (local / runfiles.JOB).exists():
                try:  # the job may have forged it: mirrored only when it can be believed
                    runfiles.check_job(answer["job"])
                except runfiles.BadRunFile as exc:
                    log.debug("attempt %s: job.json not mirrored: %s", handle.attempt_id, exc)
                else:
                    runfiles.write_json(local / runfiles.JOB, answer["job"])
        except OSError as exc:
            log.warning("attempt %s: cannot mirror %s: %s", handle.attempt_id, local, exc)
        self._answers[_key(handle)] = answer
        self._fresh.add(_key(handle))

    def _answer(self, handle: Handle) -> dict | None:
        """This pass's answer for the attempt; asked now when no request for its server
        is under way."""
        key = (handle.data.get("node"), handle.data.get("account"))
        link = self._handle_link(handle)
        self._collect(0)
        fresh = _key(handle) in self._fresh
        if not fresh and key not in self._inflight and link.retry_due():
            self._inflight[key] = self._pool.submit(self._status, link, [handle])
            self._collect(self.poll_wait_s)
        if _key(handle) not in self._fresh:
            return None
        self._fresh.discard(_key(handle))  # each answer serves one poll
        return self._answers[_key(handle)]

    def _do_poll(self, handle: Handle) -> PollResult:
        answer = self._answer(handle)
        if answer is None:
            link = self._handle_link(handle)
            why = link.last_error or "no answer yet"
            return PollResult(RunStatus.UNREACHABLE, detail=f"node {link.target.node}: {why}")
        return poll_result(answer["exit"], answer["monitor_alive"], answer["job_alive"])

    def _do_progress(self, handle: Handle) -> tuple[float, float | None] | None:
        answer = self._answers.get(_key(handle))
        text = answer.get("progress") if answer else None
        return runfiles.parse_progress(text) if text else None

    def unreachable_nodes(self) -> dict[str, float]:
        """Nodes whose own account's link is down (a ``{user}`` node's other accounts
        failing make only their attempts unreachable)."""
        return {n: link.down_since for n, link in self.links.items() if not link.up}

    # -- signals and recovery -----------------------------------------------------------
    def _do_signal(self, handle: Handle, sig: int) -> bool:
        link = self._handle_link(handle)
        return link.verb("signal", handle.data["remote_run_dir"], str(sig))["sent"]

    def fence(self, handle: Handle) -> bool:
        link = self._handle_link(handle)
        remote = handle.data.get("remote_run_dir")  # none: its launch never answered
        name = _remote_name(handle.attempt_id, handle.run_dir)
        remote = remote or link.target.remote_path("run", name)
        try:
            out = link.verb("fence", remote)
        except HostUnreachable:
            return False
        if out.get("killed"):
            log.info("attempt %s: killed what still ran of it on node %s",
                     handle.attempt_id, link.target.node)  # fmt: skip
        return out.get("settled") is True  # a monitor about to start the job: not yet

    def _do_recover(self, attempt_id: int, run_dir: str, node: str | None) -> Handle | None:
        link = self._handle_link(Handle(attempt_id, run_dir, {"node": node}))
        out = link.verb("claim", link.target.remote_path("run", _remote_name(attempt_id, run_dir)))
        claim = out["claim"] or ""  # checked: "abandoned" or "started <pid> <ticks>"
        if out["claimed"] or not claim.startswith("started"):
            return None
        _, pid, ticks = claim.split()
        data = {
            "node": node,
            "remote_run_dir": out["run_dir"],
            "log_path": out["log_path"],
            "monitor": {"pid": int(pid), "start_ticks": int(ticks)},
        }
        if link is not self.links.get(node or ""):
            data["account"] = link.target.user
        return Handle(attempt_id=attempt_id, run_dir=run_dir, data=data)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for link in [*self.links.values(), *self._accounts.values()]:
            try:
                link.close()
            except Exception as exc:  # closing is best effort
                log.debug("node %s: close: %s", link.target.node, exc)


def _key(handle: Handle) -> tuple:
    """An attempt on a node (the parts of a job across servers share their attempt)."""
    return (handle.attempt_id, handle.data.get("node"))


def _remote_name(attempt_id: int, run_dir: str) -> str:
    """The attempt's run directory's name on its server: a part of a job across servers
    (local run directory ``part-<rank>``) has its own, as servers may share a home."""
    part = Path(run_dir).name
    return f"attempt-{attempt_id}-{part}" if part.startswith("part-") else f"attempt-{attempt_id}"
