"""Splitting a running pair (EaCO's early-stage observations): the pure rule, and the
simulator's splits, where a pair runs slower than predicted and one job's deadline is at
risk: that job is checkpointed and restarts alone, its partner runs on at full speed."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from orchestrator.planning.devices.splitting import Member, should_split, to_split
from orchestrator.planning.policies import resolve_policy
from orchestrator.sim.hardware.colocation import daemon_class
from orchestrator.sim.hardware.splits import Splits
from orchestrator.sim.inputs import prepare
from orchestrator.sim.runner import make_forecaster
from orchestrator.sim.scenario import Scenario
from tests.conftest import ROOT
from tests.test_colocation_sim import GUEST, HOST, _gavel  # V100: 0.89, 0.85 predicted

pytestmark = pytest.mark.backends("sqlite")

H = 3600.0


def _member(job=1, speed=0.5, left_s=2 * H, deadline_s=3 * H, interruptible=True, ckpt=300.0):
    return Member(job, speed, left_s, deadline_s, interruptible, ckpt)


def test_a_job_at_risk_splits_one_in_time_does_not():
    assert should_split(_member(speed=0.5), 0.0)  # 4 h at half speed: past 3 h; alone 2 h 5 m
    assert not should_split(_member(speed=0.8), 0.0)  # 2.5 h: in time next to its partner
    assert not should_split(_member(speed=None), 0.0)  # not measured yet
    assert not should_split(_member(deadline_s=None), 0.0)  # no deadline: nothing at risk


def test_no_split_for_a_job_that_may_not_be_interrupted():
    assert not should_split(_member(interruptible=False), 0.0)


def test_no_split_when_restarting_alone_would_miss_the_deadline_too():
    # 2 h left plus a 5 min checkpoint: past a deadline 2 h 2 min away, so it stays paired
    assert not should_split(_member(deadline_s=2 * H + 120.0), 0.0)
    assert should_split(_member(deadline_s=2 * H + 300.0), 0.0)  # just fits alone


def test_a_partner_leaving_soon_keeps_a_job_from_a_split():
    # half speed for 1 h (30 min done), then alone: ends at 2 h 30 min, in time for 3 h
    assert not should_split(replace(_member(speed=0.5), partner_end_s=H), 0.0)
    # half speed for 2 h 30 min: 45 min left after, ends at 3 h 15 min: past
    assert should_split(replace(_member(speed=0.5), partner_end_s=2.5 * H), 0.0)


def test_only_the_job_whose_own_speed_shows_the_risk_leaves():
    # job 1 reports a crawl (true or a lie): it alone leaves; its partner, whose own speed
    # keeps its deadline, stays, whatever job 1 says
    slow, partner = _member(job=1, speed=0.1), _member(job=2, speed=0.9, deadline_s=2.5 * H)
    assert to_split([slow, partner], 0.0) == [1]
    assert to_split([partner], 0.0) == []


def _run(tmp_path, gpus=2, more=()):
    """HOST from 10:00 (2 h, no deadline), GUEST from 10:30 (2 h, by 12:55) on two GPUs.
    The model predicts 0.89 / 0.85 paired (GUEST ends by 12:52: it joins HOST); Gavel
    measured 0.7 / 0.6 (here): paired, GUEST would end about 13:21."""
    rows = [
        {"submit": "2023-05-01T10:00:00", "duration": "2h", "gpus": 1, "name": HOST},
        {"submit": "2023-05-01T10:30:00", "duration": "2h", "gpus": 1, "name": GUEST,
         "within": "2h25m"},
        *more,
    ]  # fmt: skip
    trace = tmp_path / "jobs.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    scenario = Scenario.model_validate(
        {
            "policies": ["fifo"],
            "jobs": {"source": str(trace), "deadline_rule": "none", "share": 1.0,
                     "interruptible": 1.0, "checkpoint_cost": "5m", "elastic": 0.0,
                     "pair_speeds": str(_gavel(tmp_path, 0.7, 0.6))},
            "grid": {"source": "synthetic:days=14&start=2023-04-28"},
            "cluster": {"gpus": gpus, "gpus_per_node": gpus, "gpu": "v100"},
        }
    )  # fmt: skip
    inputs = prepare(scenario, ROOT)
    daemon = daemon_class(inputs)(
        inputs, resolve_policy("fifo"), make_forecaster("perfect", inputs, 0)
    )
    return inputs, daemon, daemon.run()


def test_without_splits_the_slow_pair_misses_the_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(Splits, "step", lambda self, now: False)
    inputs, daemon, run = _run(tmp_path)
    assert [p[:2] for p in daemon.pairs] == [(0, 1)]
    assert run.splits == 0 and run.finish_s[1] > inputs.deadline_s[1]


def test_the_job_at_risk_is_split_once_restarts_alone_and_keeps_its_deadline(tmp_path):
    inputs, daemon, run = _run(tmp_path)
    submit = inputs.jobs.submit_s
    assert run.splits == 1
    assert [p[:2] for p in daemon.pairs] == [(0, 1)]  # never paired again
    split_at = submit[1] + 600.0  # MOVE_AFTER_S after they paired
    # GUEST: 10 min at 0.6, less its 5 min checkpoint, then alone at full speed
    done = 600.0 * 0.6 / (2 * H) - 300.0 / (2 * H)
    assert run.finish_s[1] == pytest.approx(split_at + 2 * H * (1 - done), abs=1.0)
    assert run.finish_s[1] <= inputs.deadline_s[1]
    # HOST: 30 min alone, 10 min at 0.7, then alone at full speed again
    assert run.finish_s[0] == pytest.approx(split_at + 1.5 * H - 600.0 * 0.7, abs=1.0)


def test_no_split_while_a_job_waits_for_gpus(tmp_path):
    # from 10:35 a job on both GPUs waits (one is free): GUEST would restart behind it
    wide = {"submit": "2023-05-01T10:35:00", "duration": "1h", "gpus": 2, "name": HOST}
    inputs, _, run = _run(tmp_path, more=[wide])
    assert run.splits == 0 and run.finish_s[1] > inputs.deadline_s[1]


def test_no_split_without_a_gpu_free_to_restart_on(tmp_path):
    # one GPU: alone, GUEST would wait for HOST's end, and that would not keep its deadline
    inputs, daemon, run = _run(tmp_path, gpus=1)
    assert [p[:2] for p in daemon.pairs] == [(0, 1)]
    assert run.splits == 0 and run.finish_s[1] > inputs.deadline_s[1]
