"""Co-location moves that empty a server (``[jobs] moves = "empty-servers"``): while no
job waits, the jobs of a server that all run alone and may be interrupted move next to
jobs alone on other servers, and right-sizing powers the emptied server down; never
without right-sizing, never a job that may not be interrupted, never back and forth."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from orchestrator.planning.policies import resolve_policy
from orchestrator.sim.hardware.colocation import daemon_class
from orchestrator.sim.inputs import prepare
from orchestrator.sim.runner import make_forecaster
from orchestrator.sim.scenario import JobsConfig, Scenario
from tests.conftest import ROOT

pytestmark = pytest.mark.backends("sqlite")
A, B = "Recommendation (batch size 4096)", "LM (batch size 20)"  # V100: 0.89, 0.85 paired
AT = "2023-05-01T10:00:00"


def _run(tmp_path, moves="empty-servers", host_may_stop=False, right_sizing=True,
         movable=True, duration="6h", n1_gpus=2, rows=None, nodes=None):  # fmt: skip
    """H (A) alone on n0's one GPU, X (B) alone on n1, whose other GPU is free; both start
    at 10:00 (a pair forms only with a job already running), nobody waits after. X may
    move from 10:20 (twice its five-minute checkpoint plus 10 min after it started)."""
    rows = rows or [
        {"submit": AT, "duration": duration, "gpus": 1, "name": A,
         "interruptible": host_may_stop},
        {"submit": AT, "duration": duration, "gpus": 1, "name": B, "interruptible": movable},
    ]  # fmt: skip
    trace = tmp_path / "jobs.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    nodes = nodes or [{"name": "n0", "gpus": 1}, {"name": "n1", "gpus": n1_gpus}]
    cluster = {"gpu": "v100", "nodes": nodes}
    if right_sizing:
        cluster |= {"idle_off_after": "10m", "wake": "5m"}
    scenario = Scenario.model_validate(
        {
            "policies": ["fifo"],
            "jobs": {"source": str(trace), "deadline_rule": "none", "share": 1.0,
                     "checkpoint_cost": "5m", "elastic": 0.0, "moves": moves},
            "grid": {"source": "synthetic:days=14&start=2023-04-28"},
            "cluster": cluster,
        }
    )  # fmt: skip
    inputs = prepare(scenario, ROOT)
    daemon = daemon_class(inputs)(
        inputs, resolve_policy("fifo"), make_forecaster("perfect", inputs, 0)
    )
    return inputs, daemon, daemon.run()


def _total_j(run, end_s: float) -> float:
    """The jobs' energy and the idle draw's, to ``end_s``."""
    jobs = float(np.sum(run.seg_power_w * (run.seg_end_s - run.seg_start_s)))
    idle = run.idle.padded(end_s)
    return jobs + float(np.sum(idle.power_w * (idle.end_s - idle.start_s)))


def test_a_server_is_emptied_and_powered_down_and_the_cluster_draws_less(tmp_path):
    inputs, daemon, run = _run(tmp_path)
    assert run.moves == 1 and run.suspensions == 1  # X checkpointed, restarted next to H
    (host, moved, when), *_ = daemon.pairs
    assert (host, moved) == (0, 1)
    assert when == pytest.approx(inputs.jobs.submit_s[0] + 20 * 60)  # once it may move
    assert run.idle.power_offs >= 1  # n1, emptied, powered down after idle_off_after
    _, _, stayed = _run(tmp_path, moves=False)
    assert stayed.moves == 0 and not stayed.pairs
    end = float(max(np.nanmax(run.finish_s), np.nanmax(stayed.finish_s)))
    assert _total_j(run, end) < 0.9 * _total_j(stayed, end)  # the checkpoint included
    assert run.finish_s[1] > stayed.finish_s[1]  # what it costs: X runs paired, slower


def test_no_server_is_emptied_without_right_sizing(tmp_path):
    # its idle GPUs would draw as much after the move: two jobs slowed down for nothing
    _, daemon, run = _run(tmp_path, right_sizing=False)
    assert run.moves == 0 and run.suspensions == 0 and not daemon.pairs


def test_a_job_that_may_not_be_interrupted_keeps_its_server(tmp_path):
    _, daemon, run = _run(tmp_path, movable=False)
    assert run.moves == 0 and run.suspensions == 0 and not daemon.pairs


def test_the_idle_draw_saved_is_what_makes_a_short_move_pay(tmp_path):
    # 31 min each: at 10:20, 11 min are left; the pair alone saves less than twice the
    # checkpoint (move_gain_j < 0), but n1's free GPU and its share of the server's draw
    # for 11 min tip it: it moves. With n1 of one GPU (nothing idle there), no move.
    from orchestrator.planning.devices.interference import move_gain_j

    _, _, run = _run(tmp_path, duration="31m")
    assert run.moves == 1
    assert move_gain_j(200.0, 200.0, 0.85, 0.89, 660.0, 660.0, 300.0) < 0  # the pair alone
    _, _, alone = _run(tmp_path, duration="31m", n1_gpus=1)
    assert alone.moves == 0 and alone.suspensions == 0


def test_no_move_next_to_a_host_whose_server_would_go_off_sooner(tmp_path):
    """Review: the gain counted the emptied server and never the one receiving the job. F
    (30 min) and X (12 h) on n1, H on a big server (n0, 8 GPUs) ending at 11:00: once F
    ends, moving X next to H would only swap which server stays on, with n0's seven idle
    GPUs for 11 h: no move. With H running 13 h (n0 stays on anyway), X moves."""
    rows = [
        {"submit": AT, "duration": "30m", "gpus": 2, "name": A, "interruptible": False},
        {"submit": AT, "duration": "12h", "gpus": 1, "name": B, "interruptible": True},
        {"submit": AT, "duration": "1h", "gpus": 1, "name": A, "interruptible": False},
    ]
    nodes = [{"name": "n0", "gpus": 8}, {"name": "n1", "gpus": 3}]
    _, _, run = _run(tmp_path, rows=rows, nodes=nodes)
    assert run.moves == 0 and run.suspensions == 0
    rows[2]["duration"] = "13h"
    _, daemon, moved = _run(tmp_path, rows=rows, nodes=nodes)
    assert moved.moves == 1 and [p[:2] for p in daemon.pairs] == [(2, 1)]


def test_one_server_is_emptied_and_nothing_moves_back(tmp_path):
    # both may move: n0's job goes to n1 (or n1's to n0), the receiving server is not
    # emptied in the same step, and a pair never moves after
    _, daemon, run = _run(tmp_path, host_may_stop=True)
    assert run.moves == 1 and run.suspensions == 1 and len(daemon.pairs) == 1


def test_each_kind_of_move_is_asked_for_by_name(tmp_path):
    _, _, waiting_only = _run(tmp_path, moves="waiting-jobs")
    assert waiting_only.moves == 0  # nobody waits: moves for waiting jobs have no cause
    _, _, both = _run(tmp_path, moves=True)
    assert both.moves == 1
    for bad in ("sideways", 1, 0.0, None, ["empty-servers"]):
        with pytest.raises(ValidationError, match='moves is true, false, "empty-servers"'):
            JobsConfig.model_validate({"moves": bad})


def test_the_kinds_of_move_are_the_daemons_words_case_aside():
    for word in ("Empty-Servers", " waiting-jobs "):
        assert JobsConfig.model_validate({"moves": word}).moves == word.strip().lower()
