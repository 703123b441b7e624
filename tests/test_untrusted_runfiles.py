"""Files a job can write (``power.log``, ``exit.json``, ``job.json``, and their SSH
mirror) are untrusted input: garbage is skipped, times are clamped, forged fields make the
attempt lost with a reason, never the daemon's end. No daemon here: the parts that read
them, on real files."""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from signal import SIGCONT
from types import SimpleNamespace

import pytest

from executors import procs, remote, runfiles, sshanswers
from executors.base import RunStatus
from executors.local import poll_result
from orchestrator.accounting.meter import Accountant

T0 = datetime(2026, 3, 2, 12, tzinfo=UTC)
GOOD_EXIT = {"exit_code": 0, "signal": None, "ended_at": T0.isoformat(), "energy_j": None,
             "detail": None}  # fmt: skip


def test_garbage_power_lines_are_skipped_and_the_good_ones_counted(tmp_path):
    log = tmp_path / runfiles.POWER
    t = T0.timestamp()
    log.write_bytes(
        f"{t} 0\n".encode()
        + b"abc def\n\xff\xfe garbage\nnan 5\n1 inf\n-5 3\n1 2 3\n\n"
        + f"{t + 10} 1000\n".encode()
        + b"half a li"  # being written: left for the next read
    )
    samples, offset = runfiles.read_power_log(log)
    assert samples == [(t, 0.0), (t + 10, 1000.0)]
    assert offset == log.stat().st_size - len(b"half a li")


def test_a_power_log_without_line_ends_is_skipped_not_read_whole(tmp_path):
    log = tmp_path / runfiles.POWER
    log.write_bytes(b"x" * 3000 + b"\n1 5\n")
    samples, offset = runfiles.read_power_log(log, 0, limit=1000)
    assert samples == [] and offset == 1000, "a chunk with no line end is passed over"


def _measure_in_thread(acc, att, now_s, timeout_s=10.0):
    out = {}

    def run():
        tracemalloc.start()
        out["totals"] = acc.measure(att, now_s)
        out["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()

    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"accounting still running after {timeout_s}s"
    return out["totals"], out["peak"], time.monotonic() - started


def test_a_sample_dated_far_in_the_future_is_clamped_time_and_memory_bounded(tmp_path):
    t = T0.timestamp()
    (tmp_path / runfiles.JOB).write_text(
        json.dumps({"pid": 4242, "start_ticks": 1, "started_at": T0.isoformat()})
    )
    # 1e15 s is 31 million years ahead: a meter walking UTC days to it never ends
    (tmp_path / runfiles.POWER).write_text(f"{t} 0\n{t + 60} 6000\n1e15 7000\n1e300 8e300\n")
    att = SimpleNamespace(id=1, gpu_ids=[0], run_dir=str(tmp_path), started_at=T0, cap=None)
    acc = Accountant(lambda a, b: 100.0 * (b - a), lambda a, b: None, lambda a: 0.0)
    totals, peak, took = _measure_in_thread(acc, att, t + 120)
    assert took < 5 and peak < 20e6, (took, peak)
    days = acc._meters[1].days
    assert len(days) == 1, "one UTC day, not one per day up to the forged time"
    assert totals.energy_j <= 6000 + 3000 * (120 + 300), "energy bounded by what a GPU draws"
    assert totals.energy_j >= 6000


def test_a_forged_start_cannot_walk_the_meter_back_either(tmp_path):
    (tmp_path / runfiles.JOB).write_text(
        json.dumps({"pid": 4242, "start_ticks": 1, "started_at": "0001-01-01T00:00:00+00:00"})
    )
    att = SimpleNamespace(id=2, gpu_ids=[0], run_dir=str(tmp_path), started_at=None, cap=None)
    acc = Accountant(lambda a, b: 1.0, lambda a, b: None, lambda a: 300.0)
    totals, _, took = _measure_in_thread(acc, att, T0.timestamp())
    assert took < 5 and len(acc._meters[2].days) <= 367
    assert totals.modelled


FORGED = {
    "exit code as text": {**GOOD_EXIT, "exit_code": "0"},
    "exit code a bool": {**GOOD_EXIT, "exit_code": True},
    "exit code a float": {**GOOD_EXIT, "exit_code": 1.0},
    "huge exit code": {**GOOD_EXIT, "exit_code": 10**30},
    "negative exit code": {**GOOD_EXIT, "exit_code": -1},
    "no exit code": {k: v for k, v in GOOD_EXIT.items() if k != "exit_code"},
    "huge signal": {**GOOD_EXIT, "signal": 10**9},
    "end not a time": {**GOOD_EXIT, "ended_at": "yesterday"},
    "end a number": {**GOOD_EXIT, "ended_at": 1e15},
    "end without zone": {**GOOD_EXIT, "ended_at": "2026-03-02T12:00:00"},
    "infinite energy": {**GOOD_EXIT, "energy_j": float("inf")},
    "energy as text": {**GOOD_EXIT, "energy_j": "lots"},
    "detail a list": {**GOOD_EXIT, "detail": ["x"]},
    "not JSON": "",
}


@pytest.mark.parametrize("forged", FORGED.values(), ids=FORGED.keys())
def test_a_forged_exit_record_makes_the_attempt_lost_with_a_reason(forged):
    result = poll_result(forged, monitor_alive=False, job_alive=False)
    assert result.status is RunStatus.LOST
    assert result.detail.startswith("exit.json cannot be believed")
    # while its monitor still waits, the record is not read: the monitor writes the real one
    assert poll_result(forged, monitor_alive=True, job_alive=True).status is RunStatus.RUNNING


def test_a_good_exit_record_is_read_as_before():
    result = poll_result({**GOOD_EXIT, "exit_code": 137, "signal": 9, "detail": "a\x00b"},
                         monitor_alive=False, job_alive=False)  # fmt: skip
    assert result.status is RunStatus.EXITED and (result.exit_code, result.signal) == (137, 9)
    assert result.ended_at == T0 and result.detail == "ab"


def test_an_exit_record_on_disk_that_is_not_json_reads_lost(tmp_path):
    from executors.base import Handle
    from executors.local import LocalExecutor

    (tmp_path / runfiles.EXIT).write_text('{"exit_code": 0, "ended_at": ' + "[" * 100000)
    dead = {"pid": 2**22 + 5, "start_ticks": 1}  # no such process
    result = LocalExecutor().poll(Handle(1, str(tmp_path), {"monitor": dead}))
    assert result.status is RunStatus.LOST and "cannot be believed" in result.detail


def _run_answer(**kw):
    run = {"claim": "started 1 2", "job": None, "exit": None, "monitor_alive": False,
           "job_alive": False, "progress": None, "power": "", "power_exists": False}  # fmt: skip
    return {**run, **kw}


def test_a_status_answer_that_is_not_one_is_the_nodes_error():
    for answer in ({}, {"runs": {}}, [], {"runs": [{}]}, {"runs": [_run_answer(power=5)]}):
        with pytest.raises(ValueError):
            sshanswers.check("status", answer)


def test_one_forged_exit_record_on_a_server_is_that_attempts_loss_not_its_nodes():
    forged = _run_answer(exit={**GOOD_EXIT, "exit_code": "0"}, claim="garbage")
    good = _run_answer(exit=GOOD_EXIT)
    answer = sshanswers.check("status", {"runs": [forged, good]})
    bad, ok = (poll_result(r["exit"], r["monitor_alive"], r["job_alive"]) for r in answer["runs"])
    assert bad.status is RunStatus.LOST and "cannot be believed" in bad.detail
    assert ok.status is RunStatus.EXITED and ok.exit_code == 0


def test_the_servers_status_verb_survives_forged_files(tmp_path):
    me = procs.self_id()
    runs = []
    for i, job in enumerate(['{"pid": "x", "start_ticks": 1}', '{"pid": 1, "start_ticks": -5}',
                             "[[[[", '{"pid": 0, "start_ticks": 0}']):  # fmt: skip
        run = tmp_path / f"run-{i}"
        run.mkdir()
        (run / runfiles.JOB).write_text(job)
        (run / runfiles.EXIT).write_text("not json")
        (run / runfiles.POWER).write_bytes(b"\xff\xfe 1\n1 2\n")
        runs.append({"run_dir": str(run), "monitor": me.to_dict(), "power_offset": 0})
    answer = sshanswers.check("status", remote.status({"runs": runs}))
    for run in answer["runs"]:
        assert run["job"] is None and run["job_alive"] is False
        assert len(run["power"].encode()) == len(b"\xff\xfe 1\n1 2\n"), "offsets stay true"
        assert poll_result(run["exit"], False, False).status is RunStatus.LOST
    assert remote.send_signal(runs[0]["run_dir"], 0) == {"sent": False}


def test_a_forged_job_record_is_not_signalled(tmp_path):
    import subprocess

    from executors.base import Handle
    from executors.local import LocalExecutor

    # a live process that does not lead its own process group: not a job the monitor
    # started (those lead theirs), so its group (this test's) is never signalled
    child = subprocess.Popen(["sleep", "30"])
    try:
        ident = procs.identify(child.pid)
        record = ident.to_dict() | {"started_at": T0.isoformat()}
        (tmp_path / runfiles.JOB).write_text(json.dumps(record))
        handle = Handle(1, str(tmp_path), {"monitor": procs.self_id().to_dict()})
        assert LocalExecutor().signal(handle, SIGCONT) is False
        (tmp_path / runfiles.JOB).write_text(json.dumps({"pid": "1", "start_ticks": 0}))
        assert LocalExecutor().signal(handle, SIGCONT) is False
    finally:
        child.kill()
        child.wait()


def test_check_job_accepts_what_the_monitor_and_slurm_write():
    assert runfiles.check_job({"pid": 77, "start_ticks": 5, "started_at": T0.isoformat()})
    slurm = {"pid": None, "slurm_job_id": "12", "started_at": T0.isoformat()}
    assert runfiles.check_job(slurm)["started_at"] == T0
    with pytest.raises(runfiles.BadRunFile, match="pid"):
        runfiles.check_job({"pid": None, "start_ticks": 5, "started_at": T0.isoformat()})


def test_read_json_refuses_links_and_huge_files(tmp_path: Path):
    target = tmp_path / "t.json"
    target.write_text('{"a": 1}')
    (tmp_path / "link.json").symlink_to(target)
    assert runfiles.read_json(tmp_path / "link.json") is None
    (tmp_path / "big.json").write_text('{"a": "' + "x" * (runfiles.JSON_MAX + 1) + '"}')
    assert runfiles.read_json(tmp_path / "big.json") is None
    assert runfiles.read_json(target) == {"a": 1}
