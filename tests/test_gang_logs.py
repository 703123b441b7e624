"""A job across servers' logs without servers: each part writes its own log (servers
sharing a home do not append to one file), and ``logs`` prints, tails and follows every
part of the last attempt."""

from __future__ import annotations

import base64
import io
import os
from datetime import UTC, datetime
from types import SimpleNamespace

from executors.base import Handle
from executors.gang import gang_handle

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _source(chunks: list[bytes]):
    """A log that grows by one chunk at each read of its end."""
    state = {"data": b"", "left": list(chunks)}

    def at(offset: int) -> bytes:
        if offset >= len(state["data"]) and state["left"]:
            state["data"] += state["left"].pop(0)
        return state["data"][offset:]

    return at


def _block(sources, states):
    def block(source, offset):
        source = len(sources) - 1 if source is None else source
        data = sources[source](offset)
        return {"state": states.pop(0) if len(states) > 1 else states[0],
                "sources": len(sources), "live": [1, 2],
                "data": base64.b64encode(data).decode(), "size": None}  # fmt: skip

    return block


def _show(block, **kw) -> bytes:
    from orchestrator.cli.logs import show

    out = io.BytesIO()
    show(block, block(None, 0), kw.get("lines"), kw.get("follow", False), out, 7)
    return out.getvalue()


def test_logs_prints_every_source_and_tails_every_part_of_the_last_attempt():
    def sources():
        return [_source([b"old 1\nold 2\n"]), _source([b"r0 a\nr0 b\n"]),
                _source([b"r1 a\nr1 b\n"])]  # fmt: skip

    assert _show(_block(sources(), ["running"])) == (b"old 1\nold 2\nr0 a\nr0 b\nr1 a\nr1 b\n")
    assert _show(_block(sources(), ["running"]), lines=1) == b"r0 b\nr1 b\n", "each part's"


def test_logs_follow_follows_every_part_not_only_the_highest_rank(monkeypatch):
    from orchestrator.cli import logs

    monkeypatch.setattr(logs, "POLL_S", 0.0)
    sources = [_source([b"old\n"]), _source([b"r0 1\n", b"r0 2\n"]),
               _source([b"r1 1\n", b"", b"r1 2\n"])]  # fmt: skip
    got = _show(_block(sources, ["running"] * 12 + ["completed"]), follow=True)
    for line in (b"old\n", b"r0 1\n", b"r0 2\n", b"r1 1\n", b"r1 2\n"):
        assert got.count(line) == 1, (line, got)


def test_each_part_of_a_job_across_servers_has_its_own_log(tmp_path):
    from orchestrator.daemon.launchspec import part_log_path
    from orchestrator.daemon.ops.jobs import _sources
    from orchestrator.queue import attempts
    from orchestrator.queue.attempts import AttemptState
    from orchestrator.queue.db import Database
    from orchestrator.queue.models import Job
    from orchestrator.settings import NodeConfig, Settings

    assert part_log_path("/l/7.log", 7, 0) == "/l/7.log"
    assert part_log_path("/l/7.log", 7, 1) == "/l/7.part-1.log"
    db = Database(f"sqlite:///{tmp_path / 'q.db'}")
    db.ensure_schema()
    with db.write() as session:
        job = Job(state="running", user="u", uid=os.getuid(), command=["x"], workdir="/",
                  gpus_min=4, gpus_max=4, submitted_at=T0, attempts=2)  # fmt: skip
        session.add(job)
        session.flush()
        one = attempts.begin(session, at=T0, job_id=job.id, number=1, node="a",
                             gpu_ids=[0, 1], run_dir="/r1")  # fmt: skip
        attempts.move(session, one, AttemptState.RUNNING, at=T0,
                      handle=Handle(one.id, "/r1", {"node": "a"}).to_dict())  # fmt: skip
        parts = [{"node": n, "gpu_ids": [0, 1]} for n in ("a", "b")]
        two = attempts.begin(session, at=T0, job_id=job.id, number=2, node="a",
                             gpu_ids=[0, 1], run_dir="/r2", parts=parts)  # fmt: skip
        hs = [Handle(two.id, f"/r2/part-{r}", {"node": n}) for r, n in enumerate("ab")]
        attempts.move(session, two, AttemptState.RUNNING, at=T0,
                      handle=gang_handle(two.id, "/r2", hs, False).to_dict())  # fmt: skip
        job_id = job.id
    home = {"remote_dir": "/shared"}  # both servers on one home
    nodes = [NodeConfig(name=n, executor="ssh", host="127.0.0.1", gpus=2, **home) for n in "ab"]
    settings = SimpleNamespace(nodes=nodes, log_path=Settings(home=tmp_path).log_path)
    sources, live = _sources(SimpleNamespace(db=db, settings=settings), job_id)
    paths = [(node, path.rsplit("/", 1)[-1]) for node, path, _ in sources]
    assert paths == [("a", f"{job_id}.log"), ("b", f"{job_id}.part-1.log")]
    assert live == [0, 1], "attempt 2's parts; attempt 1's log is rank 0's, printed once"
