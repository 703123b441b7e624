"""Every value is checked where it enters (issue 20): through the real CLI, each class of
bad input is one line on stderr, exit 2, nothing stored; and good input keeps working.

The CLI runs in a forked child (``tests.helpers.forkcli``): the same ``main`` as the
console script, its own environment and home, without Python's start-up for each case."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError, SpecError
from tests.helpers import forkcli

NINES = "9" * 400


@pytest.fixture(scope="module", autouse=True)
def _warm():
    forkcli.warm_up()


@pytest.fixture
def gs(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()

    def run(*argv: str, files: dict | None = None, env: dict | None = None):
        for name, content in (files or {}).items():
            data = content if isinstance(content, bytes) else content.encode()
            (home / name).write_bytes(data)
        extra = {} if "gridshift.toml" in (files or {}) else {"GRIDSHIFT_FAKE_GPUS": "4"}
        return forkcli.run(list(argv), home, {**extra, **(env or {})}, timeout_s=60)

    run.home = home
    return run


def _refused(gs, outcome, *words: str) -> None:
    assert outcome.one_line_error(), (outcome.code, outcome.stderr)
    line = outcome.error_lines()[0]
    for word in words:
        assert word in line, line
    assert "Traceback" not in outcome.stderr
    assert forkcli.stored(gs.home) == {"job": 0, "crontemplate": 0, "dependency": 0}


# -- command-line flags: durations, deadlines, 64-bit integers, NUL bytes -----------------
FLAGS = {
    "duration of 400 nines (infinity)": (["--duration", NINES + "s"], "at most one year"),
    "duration 99999999w": (["--duration", "99999999w"], "at most one year (365d)"),
    "duration just over a year": (["--duration", "366d"], "at most one year"),
    "within 99999999w": (["--within", "99999999w"], "at most one year"),
    "within of 400 nines": (["--within", NINES + "h"], "at most one year"),
    "deadline year 9999 at -14:00": (["--deadline", "9999-12-31T23:59:59-14:00"], "ISO 8601"),
    "deadline year 1 at +14:00": (["--deadline", "0001-01-01T00:00+14:00"], "ISO 8601"),
    # in the past where the zone leaves it year 1, not ISO 8601 where it does not (UTC-1h)
    "deadline year 1": (["--deadline", "0001-01-01"], "deadline '0001-01-01"),
    "deadline in 11 years": (
        ["--deadline", (datetime.now(UTC) + timedelta(days=4100)).isoformat()],
        "at most ten years",
    ),
    "empty deadline": (["--deadline", ""], "invalid deadline"),
    "deadline the duration cannot meet": (
        ["--duration", "3h", "--within", "2h"],
        "could never meet it",
    ),
    "priority past 64 bits": (["--priority", str(2**63)], "out of range"),
    "negative priority past 64 bits": (["--priority", str(-(2**63) - 1)], "out of range"),
    "gpu range past any count": (["--gpus", "1-" + "9" * 30], "at most 65536"),
    "gpus in Arabic-Indic digits": (["--gpus", "٣"], "invalid GPU count"),
    "after past 64 bits": (["--after", str(2**63)], "out of range"),
    "after in Arabic-Indic digits": (["--after", "٣"], "invalid job id"),
    "name with NUL": (["--name", "a\x00b"], "NUL byte"),
    "label with NUL": (["--label", "a\x00b"], "NUL byte"),
    "env value with NUL": (["--env", "K=a\x00b"], "NUL byte"),
    "workdir with NUL": (["--workdir", "/tmp\x00x"], "null byte"),
    "name not UTF-8": (["--name", "caf\udce9"], "not valid UTF-8"),
    "checkpoint cost over a day": (["--interruptible", "--checkpoint-cost", "2d"], "0 to one day"),
    "checkpoint cost of 400 nines": (
        ["--interruptible", "--checkpoint-cost", NINES + "s"],
        "0 to one day",
    ),
    "checkpoint cost not a duration": (
        ["--interruptible", "--checkpoint-cost", "soon"],
        "invalid checkpoint cost",
    ),
    "checkpoint cost without --interruptible": (
        ["--checkpoint-cost", "10m"],
        "--interruptible jobs only",
    ),
}


@pytest.mark.parametrize("flags,message", FLAGS.values(), ids=FLAGS.keys())
def test_bad_flags_are_one_line_and_store_nothing(gs, flags, message):
    _refused(gs, gs("submit", *flags, "--", "true"), message)


def test_nul_in_the_command_is_one_line(gs):
    _refused(gs, gs("submit", "--", "tr\x00ue"), "command argument", "NUL byte")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["show", str(2**63)], "out of range"),
        (["cancel", "1", "9" * 30], "out of range"),
        (["logs", str(2**64)], "out of range"),
        (["cron", "rm", str(2**63)], "out of range"),
        (["report", "--since", "99999999w"], "invalid --since"),
        (["budget", "--budget", NINES + "kg/day"], "at most 1000000t"),
        (["budget", "--budget", "99999999999MWh/day"], "at most 1000000MWh"),
        (["grid", "show", "-s", "csv:x.csv", "--window", NINES + "s"], "at most one year"),
        (["submit", "--cron", "0 2 * * *", "--window", "1000000w", "--", "true"], "one year"),
    ],
)
def test_other_commands_bound_their_numbers(gs, argv, message):
    _refused(gs, gs(*argv), message)


def test_an_unknown_local_time_zone_is_one_line_for_cron(gs):
    outcome = gs(
        "submit", "--cron", "0 2 * * *", "--window", "8h", "--", "true", env={"TZ": "Mars/Base"}
    )
    _refused(gs, outcome, "unknown local time zone", "Mars/Base")


def test_good_flags_keep_working(gs):
    soon = (datetime.now(UTC) + timedelta(hours=10)).isoformat()
    for flags in (
        ["--duration", "2h", "--within", "52w"],
        ["--gpus", "2-4", "--priority", "-5", "--deadline", soon, "--duration", "1h30m"],
        ["--duration", "365d", "--priority", str(2**63 - 1)],
    ):
        outcome = gs("submit", *flags, "--", "true")
        assert outcome.code == 0, outcome.stderr
    assert forkcli.stored(gs.home)["job"] == 3


# -- submit --file lines: JSON types kept ------------------------------------------------
LINES = {
    'interruptible "false"': ({"interruptible": "false"}, "interruptible must be true or false"),
    "interruptible 1": ({"interruptible": 1}, "interruptible must be true or false"),
    "priority 1.9": ({"priority": 1.9}, "priority must be a whole number"),
    "priority 1.0": ({"priority": 1.0}, "write it without .0"),
    'priority "1"': ({"priority": "1"}, "priority must be a whole number"),
    "priority true": ({"priority": True}, "priority must be a whole number"),
    "priority 2**63": ({"priority": 2**63}, "out of range"),
    "gpus 1.0": ({"gpus": 1.0}, "write it without .0"),
    "gpus true": ({"gpus": True}, "invalid GPU count"),
    "gpus 2**70": ({"gpus": 2**70}, "at most 65536"),
    'env {"K": null}': ({"env": {"K": None}}, "must be a string, not None"),
    'env {"K": 1}': ({"env": {"K": 1}}, "must be a string"),
    "env [1]": ({"env": [1]}, "env item must be a string"),
    "env 5": ({"env": 5}, "env must be an object"),
    "env value with NUL": ({"env": {"K": "a\x00"}}, "NUL byte"),
    "name 5": ({"name": 5}, "name must be a string"),
    "name {}": ({"name": {}}, "name must be a string"),
    "labels [1]": ({"labels": [1]}, "label must be a string"),
    "workdir 5": ({"workdir": 5}, "workdir must be a string"),
    "after 1.5": ({"after": [1.5]}, "after must be a whole number"),
    "after 2**64": ({"after": [2**64]}, "out of range"),
    "duration 1e20": ({"duration": 1e20}, "at most one year"),
    "duration -5": ({"duration": -5}, "longer than zero"),
    "duration true": ({"duration": True}, "duration must be a number"),
    "duration []": ({"duration": []}, "duration must be a number"),
    "within 1e12": ({"within": 1e12}, "at most one year"),
    "duration past within": ({"duration": "2h", "within": "1h"}, "could never meet it"),
}


@pytest.mark.parametrize("extra,message", LINES.values(), ids=LINES.keys())
def test_job_file_lines_keep_json_types(gs, extra, message):
    line = json.dumps({"command": ["true"], **extra})
    _refused(gs, gs("submit", "--file", "j.jsonl", files={"j.jsonl": line + "\n"}), message)


@pytest.mark.parametrize(
    "text,message",
    [
        ('{"command": ["true"], "duration": NaN}', "NaN is not a JSON number"),
        ('{"command": ["true"], "duration": Infinity}', "Infinity is not a JSON number"),
        ('{"command": ["true"], "duration": 1e309}', "must be a finite number"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"command": ["true"], "env": ' + '{"a": ' * 50_000 + "1" + "}" * 50_001, "deeply"),
        ('{"command": ["true"], "name": "a\\ud800b"}', "not valid UTF-8"),
        ('{"command": ["tr\\udfffue"]}', "not valid UTF-8"),
    ],
    ids=["NaN", "Infinity", "1e309", "deep list", "deep object", "surrogate", "surrogate 2"],
)
def test_job_file_json_beyond_the_standard_is_one_line(gs, text, message):
    _refused(gs, gs("submit", "--file", "j.jsonl", files={"j.jsonl": text + "\n"}), message)


def test_undecodable_and_endless_job_files_are_one_line(gs):
    files = {"j.jsonl": b'{"command": ["caf\xe9"]}\n'}
    _refused(gs, gs("submit", "--file", "j.jsonl", files=files), "not a text file", "0xe9")
    _refused(gs, gs("submit", "--file", "/dev/zero"), "larger than 64 MiB")


def test_good_job_file_lines_keep_working(gs):
    soon = (datetime.now(UTC) + timedelta(hours=10)).isoformat()
    lines = [
        {"command": ["true"], "gpus": 4, "duration": 7200, "interruptible": False, "priority": 3},
        {"command": "python train.py", "gpus": "2-4", "duration": "2h", "deadline": soon},
        {"command": ["true"], "env": {"K": "v"}, "within": 3600, "labels": ["a"], "name": None},
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    outcome = gs("submit", "--file", "j.jsonl", files={"j.jsonl": text})
    assert outcome.code == 0, outcome.stderr
    assert forkcli.stored(gs.home)["job"] == 3


# -- the configuration ----------------------------------------------------------------------
CONFIGS = {
    "fake_gpus 1e8 (it hung)": ("fake_gpus = 100000000\n", "fake_gpus"),
    "fake_gpu_power_w nan": ("fake_gpu_power_w = nan\n", "fake_gpu_power_w"),
    "daemon_interval_s inf": ("daemon_interval_s = inf\n", "daemon_interval_s"),
    "daemon_interval_s 1e-9": ("daemon_interval_s = 1e-9\n", "daemon_interval_s"),
    "cancel_grace_s 1e308": ("cancel_grace_s = 1e308\n", "cancel_grace_s"),
    "grid.timeout_s inf": ("[grid]\ntimeout_s = inf\n", "grid.timeout_s"),
    "daemon.slot 2h": ('[daemon]\nslot = "2h"\n', "1s to 1h"),
    "daemon.lease 1000000w": ('[daemon]\nlease = "1000000w"\n', "at most one year"),
    "node gpus 1e8": ('[[nodes]]\nname = "a"\ngpus = 100000000\n', "nodes.0.gpus"),
    "islands overlap": (
        '[[nodes]]\nname = "a"\ngpus = 4\nnvlink_islands = [[0, 1], [1, 2]]\n',
        "a GPU appears in two islands",
    ),
    "islands past the GPUs": (
        '[[nodes]]\nname = "a"\ngpus = 2\nnvlink_islands = [[0, 5]]\n',
        "must hold each of its 2 GPUs",
    ),
    "islands missing GPUs": (
        '[[nodes]]\nname = "a"\nfake_gpus = 4\nnvlink_islands = [[0, 1]]\n',
        "must hold each of its 4 GPUs",
    ),
    "empty island": ('[[nodes]]\nname = "a"\ngpus = 2\nnvlink_islands = [[]]\n', "empty island"),
    "node name with a newline": ('[[nodes]]\nname = "a\\nb"\ngpus = 2\n', "control characters"),
    "slurm time_margin nan": (
        '[[nodes]]\nname = "c"\nexecutor = "slurm"\ngpus = 4\ntime_margin = nan\n',
        "time_margin",
    ),
    "not UTF-8": (b"fake_gpus = 4\n# caf\xe9\n", "not UTF-8"),
    "nested too deeply": ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
}


@pytest.mark.parametrize("text,message", CONFIGS.values(), ids=CONFIGS.keys())
def test_bad_config_values_are_one_line(gs, text, message):
    _refused(gs, gs("nodes", files={"gridshift.toml": text}), message)


@pytest.mark.parametrize(
    "env,message",
    [
        ({"GRIDSHIFT_NODES": "not json"}, 'error parsing value for field "nodes"'),
        ({"GRIDSHIFT_GRID": "["}, 'field "grid"'),
        ({"GRIDSHIFT_NODES": "[" * 100_000 + "]" * 100_000}, "nested too deeply"),
        ({"GRIDSHIFT_FAKE_GPUS": "100000000"}, "fake_gpus"),
        ({"GRIDSHIFT_DAEMON_INTERVAL_S": "nan"}, "daemon_interval_s"),
    ],
    ids=["nodes not JSON", "grid not JSON", "deep JSON", "fake_gpus 1e8", "interval nan"],
)
def test_bad_environment_settings_are_one_line(gs, env, message):
    _refused(gs, gs("nodes", env=env), message)


def test_a_config_file_that_never_ends_is_one_line(gs):
    _refused(gs, gs("--config", "/dev/zero", "nodes"), "larger than 1 MiB")


def test_good_islands_keep_working(gs):
    config = '[[nodes]]\nname = "a"\nfake_gpus = 4\nnvlink_islands = [[0, 1], [2, 3]]\n'
    outcome = gs("nodes", "--json", files={"gridshift.toml": config})
    assert outcome.code == 0, outcome.stderr


# -- grid CSVs --------------------------------------------------------------------------------
def _csv(values: list[str], step_s: int = 3600) -> str:
    start = datetime(2023, 1, 1, tzinfo=UTC)
    rows = [
        f"{(start + timedelta(seconds=i * step_s)).isoformat()},{v}" for i, v in enumerate(values)
    ]
    return "time,carbon\n" + "\n".join(rows) + "\n"


FAR = "time,carbon\n" + "".join(f"2023-01-01T00:00:{s:02d}Z,200\n" for s in range(10))
FAR += "2026-01-01T00:00:00Z,1\n"
CSVS = {
    "negative g/kWh": (_csv(["200", "-5", "200"]), "", "row 3: -5.0", "not a carbon intensity"),
    "infinite g/kWh": (_csv(["200", "inf", "200"]), "", "row 3: inf", "not a carbon intensity"),
    "1e400 g/kWh": (_csv(["200", "1e400", "200"]), "", "row 3: inf", "0 to 1e+06"),
    "text among numbers": (_csv(["200", "x", "200"]), "", "row 3: 'x'", "not a number"),
    "ten 1 s rows, then one 3 years later": (FAR, "", "94,694,401 points", "1,000,000"),
    "1 s resolution over a year": (_csv(["1"] * 3, 365 * 86400 // 2), "?resolution=1", "points"),
    "resolution beyond a day": (_csv(["1"] * 3), "?resolution=" + "9" * 30 + "h", "1s to 24h"),
    "year 3000": (_csv(["1", "2"], 977 * 365 * 86400), "", "between 1900 and 2200"),
    "numbers for times": ("time,carbon\n1e20,1\n2e20,2\n", "", "does not hold timestamps"),
    "unknown zone": (_csv(["1"] * 3).replace("+00:00", ""), "?tz=Mars/Olympus", "time zone"),
    "zone outside the database": (
        _csv(["1"] * 3).replace("+00:00", ""),
        "?tz=../../etc/passwd",
        "unknown time zone",
    ),
}


@pytest.mark.parametrize("case", CSVS.values(), ids=CSVS.keys())
def test_bad_grid_csvs_are_one_line(gs, case):
    text, query, *words = case
    outcome = gs("grid", "show", "--json", "-s", f"csv:t.csv{query}", files={"t.csv": text})
    _refused(gs, outcome, *words)
    assert not (gs.home / "grid-cache").exists() or not any((gs.home / "grid-cache").iterdir())


def test_negative_prices_are_allowed_and_json_has_no_infinity(gs):
    text = _csv(["50", "-20", "30", ""]).replace("carbon", "price")
    outcome = gs("grid", "show", "--json", "-s", "csv:p.csv?quantity=price", files={"p.csv": text})
    assert outcome.code == 0, outcome.stderr
    summary = json.loads(outcome.stdout)  # strict JSON: NaN or Infinity would not parse
    assert summary["min"] == -20


def test_the_daemon_refuses_a_trace_too_long_to_resample(gs):
    outcome = gs("daemon", "--until-idle", "--grid", "csv:t.csv", files={"t.csv": FAR})
    assert outcome.one_line_error("daemon"), outcome.stderr
    assert "94,694,401 points" in outcome.error_lines("daemon")[0]
    assert outcome.seconds < 30


def test_print_json_writes_null_for_what_json_cannot_hold(capsys):
    from orchestrator.cli.render import print_json

    print_json({"a": math.inf, "b": [math.nan, 1.5], "c": {"d": -math.inf}})
    assert json.loads(capsys.readouterr().out) == {"a": None, "b": [None, 1.5], "c": {"d": None}}


# -- simulate inputs -------------------------------------------------------------------------
GRID = _csv(["200", "100", "300"] * 40)
TRACES = {
    "duration Infinity": ('{"submit": 0, "duration": Infinity}', "Infinity is not a JSON number"),
    "duration 1e300": ('{"submit": 0, "duration": 1e300}', "at most one year"),
    "submit 1e300": ('{"submit": 1e300, "duration": 60}', "times must lie in"),
    "submit year 9999 at -14:00": (
        '{"submit": "9999-12-31T23:59:59-14:00", "duration": 60}',
        "times must lie in 1970 to 2200",
    ),
    "gpus 2**70": (f'{{"submit": 0, "duration": 60, "gpus": {2**70}}}', "GPUs (1 to 65536)"),
    "priority 1.9": ('{"submit": 0, "duration": 60, "priority": 1.9}', "whole number"),
    'priority "x"': ('{"submit": 0, "duration": 60, "priority": "x"}', "whole number"),
    "deadline before the end": (
        '{"submit": 0, "duration": 7200, "deadline": 3600}',
        "before it could end",
    ),
    "deadline 1e300": ('{"submit": 0, "duration": 60, "deadline": 1e300}', "more than one year"),
    'interruptible "yes"': (
        '{"submit": 0, "duration": 60, "interruptible": "yes"}',
        "interruptible must be true or false",
    ),
}


@pytest.mark.parametrize("line,message", TRACES.values(), ids=TRACES.keys())
def test_bad_simulate_traces_are_one_line(gs, line, message):
    files = {"jobs.jsonl": line + "\n", "grid.csv": GRID}
    outcome = gs(
        "simulate",
        "--json",
        "--policy",
        "fifo",
        "--jobs",
        "jobs.jsonl",
        "--grid",
        "csv:grid.csv",
        files=files,
    )
    _refused(gs, outcome, message)


@pytest.mark.parametrize(
    "scenario,message",
    [
        ('timezone = "Mars/Olympus"\n', "unknown time zone"),
        ('timezone = "Europe"\n', "unknown time zone"),
        ("seed = -1\n", "seed"),
        ("power_limit_w = inf\n", "power_limit_w"),
        ('max_defer = "99999999w"\n', "at most one year"),
        ('[jobs]\nsource = "synthetic:count=5&days=99999999"\n', "days is at most"),
        ('[grid]\nsource = "synthetic:days=99999999"\n', "days must be"),
        ("[grid]\nstart = 2023-01-03T00:00:00Z\nend = 2023-01-02T00:00:00Z\n", "before grid.end"),
        ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
    ],
    ids=[
        "zone",
        "zone folder",
        "seed",
        "power",
        "defer",
        "jobs days",
        "grid days",
        "range",
        "deep",
    ],
)
def test_bad_scenarios_are_one_line(gs, scenario, message):
    files = {
        "s.toml": scenario,
        "jobs.jsonl": '{"submit": 0, "duration": 3600}\n',
        "grid.csv": GRID,
    }
    argv = ["simulate", "--json", "--policy", "fifo", "s.toml"]
    if "[jobs]" not in scenario:
        argv += ["--jobs", "jobs.jsonl"]
    if "[grid]" not in scenario:
        argv += ["--grid", "csv:grid.csv"]
    _refused(gs, gs(*argv, files=files), message)


# -- the parsers themselves -----------------------------------------------------------------
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_duration_bounds_are_said():
    from orchestrator.timeparse import parse_duration_s

    assert parse_duration_s("365d") == 365 * 86400
    assert parse_duration_s("52w") == 52 * 7 * 86400
    for text in (NINES + "s", "366d", "1e309s", "١h"):
        with pytest.raises(SpecError):
            parse_duration_s(text)


def test_build_spec_keeps_json_types():
    from orchestrator.queue.spec import build_spec

    def spec(**raw):
        return build_spec({"command": ["true"], **raw}, now=NOW, cwd="/", base_env={})

    assert spec(gpus=4, priority=2, interruptible=True).gpus_max == 4
    assert spec(within=3600).deadline == NOW + timedelta(hours=1)
    assert spec(name=None, duration=None).name is None
    for raw in (
        {"interruptible": "false"},
        {"priority": 1.9},
        {"env": {"K": None}},
        {"gpus": 1.0},
        {"after": [True]},
        {"duration": math.nan},
    ):
        with pytest.raises(SpecError):
            spec(**raw)


def test_settings_bound_what_would_hang_or_overflow(tmp_path, monkeypatch):
    from orchestrator.settings import load_settings

    monkeypatch.delenv("GRIDSHIFT_FAKE_GPUS", raising=False)
    path = tmp_path / "g.toml"
    path.write_text("fake_gpus = 1024\ndaemon_interval_s = 0.05\n")
    assert load_settings(path).fake_gpus == 1024
    for text in ("fake_gpus = 1025\n", "daemon_interval_s = inf\n", "cancel_grace_s = nan\n"):
        path.write_text(text)
        with pytest.raises(ConfigError):
            load_settings(path)


# -- rows the daemon did not check (an old or hand-edited database) -------------------------
_NOW = datetime(2026, 11, 23, tzinfo=UTC)


def _row(**changes):
    from orchestrator.queue.models import Job

    fields = dict(state="queued", user="u", uid=1000, command=["true"], workdir="/",
                  gpus_min=1, gpus_max=2, duration_s=3600.0, submitted_at=_NOW,
                  deadline=_NOW + timedelta(days=1))  # fmt: skip
    return Job(**(fields | changes))


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"duration_s": math.inf}, "duration inf s"),
        ({"duration_s": math.nan}, "duration nan s"),
        ({"duration_s": -1.0}, "longer than zero"),
        ({"duration_s": 366 * 86400.0}, "at most one year"),
        ({"gpus_max": 2**40}, "GPUs 1-1099511627776"),
        ({"gpus_min": 3}, "GPUs 3-2"),
        ({"priority": 2**70}, "64-bit"),
        ({"deadline": datetime(9999, 12, 31, tzinfo=UTC)}, "more than ten years"),
        ({"checkpoint_s": math.inf}, "checkpoint cost inf s"),
        ({"checkpoint_s": -1.0}, "checkpoint cost -1.0 s"),
        ({"checkpoint_s": 365 * 86400.0}, "0 to one day"),
    ],
)
def test_a_stored_row_out_of_bounds_is_named(changes, words):
    from orchestrator.queue.checks import stored_job_problem

    assert words in (stored_job_problem(_row(**changes)) or ""), changes


def test_a_stored_row_within_bounds_passes():
    from orchestrator.queue.checks import stored_job_problem

    assert stored_job_problem(_row()) is None
    assert stored_job_problem(_row(duration_s=None, deadline=None, gpus_min=0)) is None
    assert stored_job_problem(_row(interruptible=True, checkpoint_s=0.0)) is None
