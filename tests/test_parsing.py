"""Durations, deadlines, GPU counts, environment and job specs as people type them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.errors import SpecError
from orchestrator.queue.spec import build_spec, parse_env, parse_gpus
from orchestrator.timeparse import format_duration, parse_deadline, parse_duration_s

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("45s", 45),
        ("90m", 5400),
        ("2h30m", 9000),
        ("1.5h", 5400),
        ("1d12h", 129600),
        ("1w", 604800),
        ("2H 30M", 9000),
    ],
)
def test_durations(text, seconds):
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "90", "2hours", "h", "1h-5m", "0s", "abc", "1h30"])
def test_bad_durations(text):
    with pytest.raises(SpecError):
        parse_duration_s(text)


@given(st.integers(min_value=1, max_value=10**7))
def test_format_and_parse_round_trip(seconds):
    assert parse_duration_s(format_duration(seconds)) == seconds


def test_deadlines_are_utc_and_in_the_future():
    assert parse_deadline("2026-11-23T08:00+01:00", NOW) == datetime(2026, 11, 23, 7, 0, tzinfo=UTC)
    with pytest.raises(SpecError, match="in the past"):
        parse_deadline("2026-11-22T11:00Z", NOW)
    naive = parse_deadline("2030-01-01T00:00", NOW)
    assert naive.tzinfo == UTC and naive == datetime(2030, 1, 1).astimezone().astimezone(UTC)


@pytest.mark.parametrize(
    "value,expected",
    [(2, (2, 2)), ("2", (2, 2)), ("2-8", (2, 8)), (" 1 - 4 ", (1, 4)), ("0", (0, 0))],
)
def test_gpu_counts(value, expected):
    assert parse_gpus(value) == expected


@pytest.mark.parametrize("value", ["-1", "8-2", "x", "2-", True, -3])
def test_bad_gpu_counts(value):
    with pytest.raises(SpecError):
        parse_gpus(value)


def test_env_pairs_keep_everything_after_the_first_equals():
    assert parse_env(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}


def test_spec_from_a_sweep_line(tmp_path):
    spec = build_spec(
        {
            "command": "python train.py --lr '3e-4'",
            "gpus": "2-4",
            "within": "12h",
            "duration": 3600,
            "after": 3,
            "label": "x",
            "env": ["K=V"],
        },
        now=NOW,
        cwd=str(tmp_path),
        base_env={"PATH": "/bin"},
    )
    assert spec.command == ["python", "train.py", "--lr", "3e-4"]
    assert (spec.gpus_min, spec.gpus_max) == (2, 4)
    assert spec.deadline == NOW + timedelta(hours=12) and spec.duration_s == 3600
    assert spec.after == [3] and spec.labels == ["x"]
    assert spec.env == {"PATH": "/bin", "K": "V"} and spec.workdir == str(tmp_path)


def test_spec_rejects_unknown_fields(tmp_path):
    with pytest.raises(SpecError, match="unknown field"):
        build_spec({"command": ["true"], "gpu": 2}, now=NOW, cwd=str(tmp_path), base_env={})
