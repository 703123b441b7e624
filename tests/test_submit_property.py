"""Property: whatever ``submit`` is given (flags, or lines of a ``--file``), it either
queues jobs that the daemon's planner can plan (exit 0), or refuses with one line on stderr
and exit 2, storing nothing. Never a traceback, another exit code, a hang or a half-written
queue.

Each example runs the real command in a forked child (``tests.helpers.forkcli``) against
one SQLite home; a queued job is then planned by the daemon's own pure planner
(``planning.snapshot``: the snapshot and the ``budget`` policy the daemon uses) on a
carbon forecast."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import forkcli

EXAMPLES = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,  # the same examples on every run: a failure is reproducible
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
GPUS = 4


@pytest.fixture(scope="module", autouse=True)
def _warm():
    forkcli.warm_up()


NINES = "9" * 400
INT64 = 2**63
HOSTILE_TEXT = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["a\x00b", "\x00", "a\udcffb", "\ud800", "", " ", "x" * 5000]),
)


def _seconds_text(low: int, high: int) -> st.SearchStrategy[str]:
    unit = st.sampled_from([("s", 1), ("m", 60), ("h", 3600)])
    return st.tuples(st.integers(low, high), unit).map(
        lambda nu: f"{max(1, nu[0] // nu[1][1])}{nu[1][0]}"
    )


BAD_DURATIONS = st.one_of(
    st.sampled_from(
        [
            NINES + "s",
            "99999999w",
            "53w",
            "366d",
            "0s",
            "1e309s",
            "nan",
            "inf",
            "-1h",
            "9" * 30 + "d",
            "1y",
        ]
    ),
    HOSTILE_TEXT,
)


def _deadline_at(now: datetime, offset_s: float) -> str:
    return (now + timedelta(seconds=offset_s)).isoformat()


def _maybe(good: st.SearchStrategy, bad: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly a value a user would give; one time in four a hostile one."""
    return st.integers(0, 3).flatmap(lambda i: bad if i == 0 else good)


def _flags(now: datetime) -> st.SearchStrategy[list[str]]:
    ints_bad = st.one_of(
        st.sampled_from([INT64, -INT64 - 1, 10**30, 2**64]), st.integers(-(2**70), 2**70)
    ).map(str)
    options = {
        "--gpus": _maybe(
            st.sampled_from(["1", "2", "2-4", "0", "4"]),
            st.one_of(ints_bad, st.sampled_from(["1-" + "9" * 30, "٣", "２", "-1"]), HOSTILE_TEXT),
        ),
        "--duration": _maybe(_seconds_text(1, 30 * 3600), BAD_DURATIONS),
        "--within": _maybe(_seconds_text(1, 60 * 3600), BAD_DURATIONS),
        "--deadline": _maybe(
            st.floats(60, 40 * 86400).map(lambda o: _deadline_at(now, o)),
            st.one_of(
                st.sampled_from(
                    [
                        "9999-12-31T23:59:59-14:00",
                        "0001-01-01T00:00+14:00",
                        "0001-01-01",
                        "2001-01-01T00:00Z",
                        "+10000-01-01",
                    ]
                ),
                st.floats(-1e9, 1e12).map(lambda o: _deadline_at(now, o)),
                HOSTILE_TEXT,
            ),
        ),
        "--priority": _maybe(st.integers(-100, 100).map(str), ints_bad),
        "--after": _maybe(st.just("1"), st.one_of(ints_bad, st.sampled_from(["0", "٣", "x"]))),
        "--name": _maybe(st.text("abcxyz-_ 1", max_size=10), HOSTILE_TEXT),
        "--label": _maybe(st.text("abcxyz-_ 1", min_size=1, max_size=10), HOSTILE_TEXT),
        "--env": _maybe(
            st.sampled_from(["K=v", "A_1=", "X=a=b"]),
            st.sampled_from(["K=a\x00b", "K\x00=v", "K=\udcff", "=v", "1K=v", "NOVALUE"]),
        ),
        "--workdir": _maybe(st.just("/"), st.sampled_from(["/tmp\x00x", "/no/such", "\udcff"])),
    }
    command = _maybe(
        st.sampled_from([["true"], ["python", "train.py", "--lr", "3e-4"], ["sh", "-c", "x"]]),
        st.one_of(
            st.sampled_from([[], [""], ["tr\x00ue"], ["true", "a\x00"], ["\udcff"]]),
            st.lists(HOSTILE_TEXT, max_size=3),
        ),
    )

    @st.composite
    def flags(draw):
        argv = ["submit"]
        for flag in draw(st.lists(st.sampled_from(sorted(options)), max_size=4, unique=True)):
            argv += [flag, draw(options[flag])]
        if draw(st.booleans()):
            argv.append("--interruptible")
        return [*argv, "--", *draw(command)]

    return flags()


JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),  # NaN and infinities included: json.dumps writes NaN, Infinity
    st.text(max_size=10),
)
JSON_ANY = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


def _lines(now: datetime) -> st.SearchStrategy[dict]:
    bad_ints = st.sampled_from([INT64, -INT64 - 1, 10**30, 1.9, 1.0, True, "1", None])
    fields = {
        "command": _maybe(st.just(["true"]), st.one_of(JSON_ANY, st.just("'unclosed"))),
        "name": _maybe(st.text("abc-_ ", max_size=8), st.one_of(HOSTILE_TEXT, JSON_ANY)),
        "gpus": _maybe(st.sampled_from([1, 2, 4, 0, "2-4", "1"]), st.one_of(bad_ints, JSON_ANY)),
        "duration": _maybe(
            st.one_of(st.integers(1, 30 * 3600), _seconds_text(1, 30 * 3600)),
            st.one_of(
                st.sampled_from([math.nan, math.inf, -math.inf, 1e309, 0, -5, 1e20, 31_622_400]),
                BAD_DURATIONS,
                JSON_ANY,
            ),
        ),
        "within": _maybe(_seconds_text(1, 60 * 3600), st.one_of(BAD_DURATIONS, JSON_ANY)),
        "deadline": _maybe(
            st.floats(60, 40 * 86400).map(lambda o: _deadline_at(now, o)),
            st.one_of(st.sampled_from(["9999-12-31T23:59:59-14:00", "0001-01-01"]), JSON_ANY),
        ),
        "interruptible": _maybe(
            st.booleans(), st.one_of(st.sampled_from(["false", "true", 0, 1, "no"]), JSON_ANY)
        ),
        "priority": _maybe(st.integers(-100, 100), st.one_of(bad_ints, JSON_ANY)),
        "after": _maybe(st.just([]), st.one_of(bad_ints, JSON_ANY)),
        "labels": _maybe(
            st.lists(st.text("abc", min_size=1, max_size=4), max_size=2),
            st.one_of(st.lists(HOSTILE_TEXT, max_size=2), JSON_ANY),
        ),
        "env": _maybe(
            st.dictionaries(st.sampled_from(["K", "A_1"]), st.text("abc=", max_size=4)),
            st.one_of(
                st.sampled_from(
                    [
                        {"K": None},
                        {"K": 1},
                        {"K": True},
                        {"K": "a\x00"},
                        {"K\x00": "v"},
                        ["K=\x00"],
                        [1],
                        "K=V",
                        5,
                    ]
                ),
                JSON_ANY,
            ),
        ),
        "workdir": _maybe(st.just("/"), st.sampled_from(["/no/such", "/tmp\x00x", 5, [], None])),
        "colour": st.just("green"),  # an unknown field
    }
    known = sorted(set(fields) - {"colour"})

    @st.composite
    def line(draw):
        raw = {"command": ["true"]}
        chosen = draw(st.lists(st.sampled_from(known), max_size=4, unique=True))
        if draw(st.integers(0, 9)) == 0:
            chosen.append("colour")
        for key in chosen:
            raw[key] = draw(fields[key])
        return raw

    return line()


def _check(
    outcome: forkcli.Outcome,
    before: dict,
    after: dict,
    home: Path,
    added: int,
    given: list[dict] | None = None,
) -> None:
    assert outcome.code in (0, 2), f"exit {outcome.code}:\n{outcome.stderr}"
    if outcome.code == 2:
        assert outcome.one_line_error(), outcome.stderr
        assert after == before, "a refused submission stored something"
        return
    said = outcome.stderr.splitlines()  # what the daemon will do, one line per job
    assert all(re.match(r"job \d+: (starts|may wait) .*; run time ", line) for line in said), (
        outcome.stderr
    )
    assert after["job"] == before["job"] + added, (before, after)
    _plan(home, before["job"], given)


def _same_as_given(job, raw: dict) -> None:
    """No silent wrong acceptance: what is stored is what the line said."""
    assert job.interruptible is raw.get("interruptible", False) or (
        raw.get("interruptible") is None and job.interruptible is False
    ), (job.interruptible, raw)
    assert job.priority == (raw.get("priority") or 0), (job.priority, raw)
    assert type(raw.get("priority", 0)) in (int, type(None)), raw
    for key, value in (raw.get("env") or {}).items() if isinstance(raw.get("env"), dict) else ():
        assert job.env[key] == value, (key, job.env.get(key), value)
    if isinstance(raw.get("gpus"), int):
        assert job.gpus_min == job.gpus_max == raw["gpus"], raw
    if raw.get("duration") is not None and not isinstance(raw["duration"], str):
        assert job.duration_s == float(raw["duration"]), raw


def _plan(home: Path, known: int, given: list[dict] | None) -> None:
    """The daemon's planner plans every job the submission queued."""
    import numpy as np

    from grid.forecasters import StepForecaster
    from grid.steps import StepSeries
    from orchestrator.planning.perfmodel import curve_for
    from orchestrator.planning.policies import resolve_policy
    from orchestrator.planning.snapshot import PlanInputs, build_snapshot, plan_rows
    from orchestrator.queue import store
    from orchestrator.queue.db import Database

    db = Database(f"sqlite:///{home / 'gridshift.db'}")
    try:
        with db.read() as session:
            jobs = [j for j in store.list_jobs(session, include_finished=False) if j.id > known]
    finally:
        db.dispose()
    assert jobs
    for job, raw in zip(jobs, given or [], strict=False):
        _same_as_given(job, raw)
    now_s = datetime.now(UTC).timestamp()
    hours = 15 * 24
    carbon = StepForecaster(
        StepSeries(now_s - 3600, 3600.0, 300 + 100 * np.sin(np.arange(hours) / 24 * 2 * np.pi))
    )
    inputs = PlanInputs(now_s, jobs, [], GPUS, curve_for(None), carbon, slot_s=900.0)
    rows = plan_rows(resolve_policy("budget"), build_snapshot(inputs, GPUS), inputs)
    assert {r["id"] for r in rows} == {j.id for j in jobs}
    by_id = {j.id: j for j in jobs}
    for row in rows:
        start = datetime.fromisoformat(row["start"]).timestamp()
        assert math.isfinite(start) and start >= now_s - 1, row
        assert 0 <= row["gpus"] <= GPUS, row
        job = by_id[row["id"]]
        if len(jobs) == 1 and job.deadline is not None and row["end"] is not None:
            # alone on the cluster, a job the queue took can meet its deadline
            end = datetime.fromisoformat(row["end"]).astimezone(UTC)
            assert end <= job.deadline + timedelta(seconds=900), (row, job.deadline)


@EXAMPLES
@given(data=st.data())
def test_submit_flags_queue_a_plannable_job_or_are_one_line(tmp_path, data):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    argv = data.draw(_flags(datetime.now(UTC)), label="argv")
    before = forkcli.stored(home)
    outcome = forkcli.run(argv, home, {"GRIDSHIFT_FAKE_GPUS": str(GPUS)}, timeout_s=60)
    _check(outcome, before, forkcli.stored(home), home, added=1)


@EXAMPLES
@given(data=st.data())
def test_submit_file_lines_queue_plannable_jobs_or_are_one_line(tmp_path, data):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    lines = data.draw(st.lists(_lines(datetime.now(UTC)), min_size=1, max_size=3), label="lines")
    (home / "jobs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    before = forkcli.stored(home)
    outcome = forkcli.run(
        ["submit", "--file", "jobs.jsonl"], home, {"GRIDSHIFT_FAKE_GPUS": str(GPUS)}, timeout_s=60
    )
    _check(outcome, before, forkcli.stored(home), home, added=len(lines), given=lines)
