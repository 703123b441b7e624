"""A catalogue of bad inputs tried through the real CLI. Prints JSON.

Each case runs ``gridshift`` (``orchestrator.cli.app.main``, the console script's entry)
in a forked child with a fresh ``GRIDSHIFT_HOME`` and 4 fake GPUs, a 2 GiB memory limit
and a 30 s time limit. A case passes when the command exits 2 with exactly one line on
stderr (``gridshift: error: ...``, no traceback) and nothing stored: no job, no cron
template, no grid-cache file (``daemon`` logs as it starts: there the error must be the
last line and the only one that is not a log record). Categories: CLI flags, ``submit
--file`` lines, config files and ``GRIDSHIFT_*`` variables, grid CSVs, ``simulate``
inputs, time zones. Issue 24's options (``--gpu-type``, ``--share``, the nodes' co-location,
idle-power and right-sizing keys, the site power limit, ``simulate --cluster``) are in the
category each belongs to; the power commands' ownership cases (a program or config others
than root may change) are tried only as root, the only user the daemon checks it for. A
few good inputs (``controls``) must keep working (exit 0); they are reported apart.

    python benchmarks/bad_inputs.py [--category NAME] [--verbose]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import forkcli  # noqa: E402  (the runner the property test uses too)

NINES = "9" * 400
BIG = str(2**63)  # one past the largest 64-bit integer
HUGE = "9" * 30
TIME_LIMIT_S = 30.0


@dataclass
class Case:
    category: str
    name: str
    argv: list[str]
    files: dict[str, str | bytes] = field(default_factory=dict)  # relative to the home
    env: dict[str, str] = field(default_factory=dict)
    expect: int = 2  # controls: 0
    modes: dict[str, int] = field(default_factory=dict)  # chmod after writing the files
    owners: dict[str, int] = field(default_factory=dict)  # chown (uid) after writing them
    links: dict[str, str] = field(default_factory=dict)  # symlink -> target, in the home


# -- the catalogue ----------------------------------------------------------------------
BAD_DURATIONS = [
    NINES + "s",
    "99999999w",
    "53w",
    "366d",
    "8785h",
    "0s",
    "-1h",
    "1e309s",
    "nan",
    "inf",
    "infh",
    "1h-",
    "",
    "h",
    "1.5.5h",
    "9" * 5000 + "w",
    "1y",
]
BAD_DEADLINES = [
    "9999-12-31T23:59:59+00:00",
    "9999-12-31T23:59:59-14:00",
    "0001-01-01T00:00:00+14:00",
    "0001-01-01",
    "2001-01-01T00:00Z",
    "2999-01-01T00:00Z",
    "2040-01-01T00:00Z",
    "2030-13-01T00:00Z",
    "2030-01-01T00:00+24:00",
    "+10000-01-01",
    "nan",
    "tomorrow",
    "",
    NINES,
]


def cli_cases() -> list[Case]:
    c = "cli"
    out: list[Case] = []
    for d in BAD_DURATIONS:
        out.append(Case(c, f"--duration {d[:20]!r}", ["submit", "--duration", d, "--", "true"]))
    for d in BAD_DURATIONS[:12]:
        if d == "0s":  # --within 0: no deferral (issue 21), a control below
            continue
        out.append(Case(c, f"--within {d[:20]!r}", ["submit", "--within", d, "--", "true"]))
    for d in BAD_DEADLINES:
        out.append(Case(c, f"--deadline {d[:20]!r}", ["submit", "--deadline", d, "--", "true"]))
    out.append(
        Case(
            c,
            "duration longer than --within",
            ["submit", "--duration", "3h", "--within", "2h", "--", "true"],
        )
    )
    for g in (HUGE, NINES, BIG, "-1", "1-" + HUGE, "1e3", "٣", "１", "2.5", "", "8-2", "0-"):
        out.append(Case(c, f"--gpus {g[:20]!r}", ["submit", "--gpus", g, "--", "true"]))
    for p in (BIG, "-" + str(2**63 + 1), HUGE, NINES, "1.5", "high", "1e3"):
        out.append(Case(c, f"--priority {p[:20]!r}", ["submit", "--priority", p, "--", "true"]))
    for a in (BIG, HUGE, "-1", "1,,2", "x", "0", "٣"):
        out.append(Case(c, f"--after {a[:20]!r}", ["submit", "--after", a, "--", "true"]))
    for cmd in ("show", "cancel", "logs"):
        for i in (BIG, HUGE, "-1"):
            out.append(Case(c, f"{cmd} {i[:20]}", [cmd, i]))
    for i in (BIG, HUGE):
        out.append(Case(c, f"cron rm {i[:20]}", ["cron", "rm", i]))
    for w in ("1000000w", NINES + "s", "0s", "nan"):
        out.append(
            Case(
                c,
                f"--window {w[:20]!r}",
                ["submit", "--cron", "0 2 * * *", "--window", w, "--", "true"],
            )
        )
    out += [
        Case(c, "name with NUL", ["submit", "--name", "a\x00b", "--", "true"]),
        Case(c, "label with NUL", ["submit", "--label", "a\x00b", "--", "true"]),
        Case(c, "env value with NUL", ["submit", "--env", "K=a\x00b", "--", "true"]),
        Case(c, "env name with NUL", ["submit", "--env", "K\x00=b", "--", "true"]),
        Case(c, "command with NUL", ["submit", "--", "tr\x00ue"]),
        Case(c, "argument with NUL", ["submit", "--", "true", "a\x00"]),
        Case(c, "workdir with NUL", ["submit", "--workdir", "/tmp\x00x", "--", "true"]),
        Case(c, "name with a lone surrogate", ["submit", "--name", "a\udcffb", "--", "true"]),
        Case(c, "sweep file is /dev/zero", ["submit", "--file", "/dev/zero"]),
        Case(c, "sweep file is a directory", ["submit", "--file", "/"]),
    ]
    for s in (NINES + "s", "0s", "2h", "nan"):
        out.append(Case(c, f"daemon --slot {s[:20]!r}", ["daemon", "--until-idle", "--slot", s]))
    for b in ("infkg/day", "nankg/day", "-5kg/day", "1e400kg/day", NINES + "kg/day"):
        out.append(
            Case(c, f"daemon --budget {b[:20]!r}", ["daemon", "--until-idle", "--budget", b])
        )
        out.append(Case(c, f"budget --budget {b[:20]!r}", ["budget", "--budget", b]))
    for i in ("0", "nan", "inf", "-1"):
        out.append(Case(c, f"daemon --interval {i}", ["daemon", "--until-idle", "--interval", i]))
    for s in ("99999999w", NINES + "s", "+10000-01-01", "-1d", "soon", "0s"):
        out.append(Case(c, f"report --since {s[:20]!r}", ["report", "--since", s]))
    return out + issue24_cli_cases()


TYPED = (
    '[[nodes]]\nname = "a"\nfake_gpus = 2\ngpu_model = "V100"\n'
    '[[nodes]]\nname = "b"\nfake_gpus = 4\n'
)
BAD_GPU_TYPES = ["h900", "v100", "V100", "NVIDIA", "!!!", "   ", "a" * 65, "v100\x00", "ü100",
                 "v 100", "-v100", "x" * 5000, "tesla-"]  # fmt: skip
BAD_POWERS = ["15kWh", "0", "0W", "-15kW", "nan", "inf", "infW", "1e3kW", "2GW", "1.5GW",
              NINES + "W", "", "kW", "15kW/h", "15,5kW", "１５kW", "1001MW"]  # fmt: skip


def issue24_cli_cases() -> list[Case]:
    """Issue 24's options: --gpu-type and --share on submit, --power-limit on daemon and
    plan (a limit below what 4 fake GPUs draw at their lowest included)."""
    c = "cli"
    out = []
    for t in BAD_GPU_TYPES:
        out.append(Case(c, f"--gpu-type {t[:20]!r}", ["submit", "--gpu-type", t, "--", "true"]))
    cron = ["submit", "--cron", "0 2 * * *", "--window", "8h"]
    for t in ("h900", "!!!", "   "):
        out.append(Case(c, f"--cron --gpu-type {t!r}", [*cron, "--gpu-type", t, "--", "true"]))
    out += [
        Case(c, "--share with --gpu-type '!!!'",
             ["submit", "--share", "--gpu-type", "!!!", "--", "true"]),
        Case(c, "--share with --gpu-type h900",
             ["submit", "--share", "--gpu-type", "h900", "--interruptible", "--", "true"]),
        Case(c, "--share=yes", ["submit", "--share=yes", "--", "true"]),
        Case(c, "--cron --share --gpu-type h900",
             [*cron, "--share", "--gpu-type", "h900", "--", "true"]),
        Case(c, "--file with --gpu-type", ["submit", "--file", "j.jsonl", "--gpu-type", "fake"],
             {"j.jsonl": '{"command": ["true"]}\n'}),
        Case(c, "--file with --share", ["submit", "--file", "j.jsonl", "--share"],
             {"j.jsonl": '{"command": ["true"]}\n'}),
    ]  # fmt: skip
    typed = {"gridshift.toml": TYPED}  # 2 V100s, and 4 other GPUs on a larger node
    out += [
        Case(
            c,
            "--gpus 3 --gpu-type v100 (2 V100s)",
            ["submit", "--gpus", "3", "--gpu-type", "v100", "--", "true"],
            typed,
        ),
        Case(
            c,
            "--gpus 3-4 --gpu-type v100 --share (2 V100s)",
            ["submit", "--gpus", "3-4", "--gpu-type", "v100", "--share", "--", "true"],
            typed,
        ),
        Case(
            c,
            "sweep: --gpus 3 gpu_type v100 (2 V100s)",
            ["submit", "--file", "j.jsonl"],
            {
                **typed,
                "j.jsonl": '{"command": ["true"], "gpu_type": "v100"}\n'
                '{"command": ["true"], "gpu_type": "v100", "gpus": 3}\n',
            },
        ),
    ]
    for p in BAD_POWERS:
        out.append(
            Case(c, f"daemon --power-limit {p[:20]!r}",
                 ["daemon", "--until-idle", "--power-limit", p])
        )  # fmt: skip
    for p in BAD_POWERS[:10]:
        out.append(Case(c, f"plan --power-limit {p[:20]!r}", ["plan", "--power-limit", p]))
    out += [
        Case(c, "daemon --power-limit 1W (below the GPUs' lowest)",
             ["daemon", "--until-idle", "--power-limit", "1W"]),
        Case(c, "daemon [daemon] power_limit = 0.5 (W)", ["daemon", "--until-idle"],
             {"gridshift.toml": "fake_gpus = 4\n[daemon]\npower_limit = 0.5\n"}),
        Case(c, "daemon --power-limit with power_caps = false",
             ["daemon", "--until-idle", "--power-limit", "15kW"],
             {"gridshift.toml": "fake_gpus = 4\n[daemon]\npower_caps = false\n"}),
    ]  # fmt: skip
    return out


def _line(obj: dict | str) -> str:
    return obj if isinstance(obj, str) else json.dumps(obj)


def file_cases() -> list[Case]:
    c = "file"
    base = {"command": ["true"]}
    lines: list[tuple[str, str]] = []

    def add(name: str, extra: dict | str) -> None:
        lines.append((name, _line({**base, **extra}) if isinstance(extra, dict) else extra))

    for v in ("false", "true", "yes", 1, 0, [], {}, "0"):
        add(f"interruptible {v!r}", {"interruptible": v})
    for v in (1.9, 1.0, "1", "-0", True, 2**63, -(2**63) - 1, 1e308, "high", [1]):
        add(f"priority {v!r}", {"priority": v})
    for v in (1.5, 1.0, True, 2**63, 10**30, -1, "x", [1], {}, "1-" + HUGE, "1e3"):
        add(f"gpus {v!r}", {"gpus": v})
    add("gpus NaN", '{"command": ["true"], "gpus": NaN}')
    add("gpus 1e400", '{"command": ["true"], "gpus": 1e400}')
    for raw in ("NaN", "Infinity", "-Infinity", "1e309", "-1e309"):
        add(f"duration {raw}", f'{{"command": ["true"], "duration": {raw}}}')
    for v in (0, -5, 1e20, 31_622_400, "99999999w", True, [], {}, NINES + "s", "nan", "inf"):
        add(f"duration {str(v)[:20]!r}", {"duration": v})
    for raw in ("NaN", "1e309", "-3600", "true", "[]", '"1e3"'):
        add(f"within {raw}", f'{{"command": ["true"], "within": {raw}}}')
    for v in ("99999999w", NINES + "s", "-1h"):  # ("0s": no deferral, a control)
        add(f"within {v[:20]!r}", {"within": v})
    for v in (12345, True, "9999-12-31T23:59:59-14:00", "0001-01-01T00:00+14:00", "2999-01-01Z"):
        add(f"deadline {v!r}", {"deadline": v})
    add("duration past within", {"duration": "2h", "within": "1h"})
    add("duration past within (seconds)", {"duration": 7200, "within": "1h59m"})
    for v in (
        {"K": None},
        {"K": 1},
        {"K": True},
        {"K": [1]},
        {"K": {"a": 1}},
        {"K": "a\x00b"},
        {"K\x00": "v"},
        {"1K": "v"},
        ["K=a\x00"],
        [1],
        [None],
        "K=V",
        5,
    ):
        add(f"env {v!r}"[:40], {"env": v})
    for v in (
        ["a\x00b"],
        ["true", 1],
        ["true", None],
        "",
        5,
        {"a": 1},
        [],
        "true \x00",
        [[]],
        "'unclosed",
    ):
        add(f"command {v!r}"[:40], {"command": v})
    for v in (5, "a\x00b", ["a"], {}, True, "x" * 100_000):
        add(f"name {v!r}"[:40], {"name": v})
    for key, v in (
        ("labels", [1]),
        ("labels", ["a\x00"]),
        ("labels", 5),
        ("labels", {"a": 1}),
        ("label", 5),
        ("label", "a\x00"),
        ("labels", [None]),
    ):
        add(f"{key} {v!r}", {key: v})
    for v in (5, "/tmp\x00x", [], True):
        add(f"workdir {v!r}", {"workdir": v})
    for v in ([1.5], [True], ["x"], 2**63, [2**64], -1, {"a": 1}, 1.0, [-(2**63) - 1]):
        add(f"after {v!r}", {"after": v})
    add("unknown field", {"colour": "green"})
    for v in ("h900", "v100", "!!!", " ", "NVIDIA", "a" * 65, "v100\x00", 5, True, [], {},
              ["fake"], 1.5):  # fmt: skip
        add(f"gpu_type {v!r}"[:40], {"gpu_type": v})
    for v in ("true", "false", "yes", 1, 0, 1.0, [], {}, "", [True]):
        add(f"share {v!r}", {"share": v})
    add("share with gpu_type '!!!'", {"share": True, "gpu_type": "!!!"})
    add("share with gpu_type h900", {"share": True, "gpu_type": "h900"})
    add("share NaN", '{"command": ["true"], "share": NaN}')
    add("gpu_type key twice", '{"command": ["true"], "gpu_type": "fake", "gpu_type": 5}')
    add("gpu-type (CLI spelling)", {"gpu-type": "fake"})
    for raw in ("[]", "1", '"x"', "null", "[1, 2]", "{", "{'a': 1}", '{"command": ["true"]} x'):
        add(f"line {raw}", raw)
    add("deep list", "[" * 100_000 + "]" * 100_000)
    add("deep object", '{"command": ["true"], "env": ' + '{"a": ' * 50_000 + "1" + "}" * 50_001)
    add("deep command", '{"command": ' + "[" * 50_000 + "]" * 50_000 + "}")
    add("lone surrogate in name", '{"command": ["true"], "name": "a\\ud800b"}')
    add("lone surrogate in command", '{"command": ["tr\\udfffue"]}')
    add("lone surrogate in env", '{"command": ["true"], "env": {"K": "\\ud800"}}')
    out = [
        Case(c, n, ["submit", "--file", "jobs.jsonl"], {"jobs.jsonl": t + "\n"}) for n, t in lines
    ]
    out += [
        Case(
            c,
            "latin-1 bytes",
            ["submit", "--file", "jobs.jsonl"],
            {"jobs.jsonl": b'{"command": ["caf\xe9"]}\n'},
        ),
        Case(
            c,
            "binary garbage",
            ["submit", "--file", "jobs.jsonl"],
            {"jobs.jsonl": bytes(range(256))},
        ),
        Case(
            c,
            "UTF-16 file",
            ["submit", "--file", "jobs.jsonl"],
            {"jobs.jsonl": '{"command": ["true"]}\n'.encode("utf-16")},
        ),
        Case(
            c,
            "good line then bad line",
            ["submit", "--file", "jobs.jsonl"],
            {"jobs.jsonl": '{"command": ["true"]}\n{"command": ["true"], "gpus": -1}\n'},
        ),
        Case(c, "empty file", ["submit", "--file", "jobs.jsonl"], {"jobs.jsonl": ""}),
        Case(c, "only comments", ["submit", "--file", "jobs.jsonl"], {"jobs.jsonl": "# x\n"}),
    ]
    return out


def config_cases() -> list[Case]:
    c = "config"
    toml: list[tuple[str, str | bytes]] = [
        ("fake_gpus 1e8", "fake_gpus = 100000000\n"),
        ("fake_gpus 2**63", f"fake_gpus = {2**63 - 1}\n"),
        ("fake_gpus -1", "fake_gpus = -1\n"),
        ("fake_gpus 1.5", "fake_gpus = 1.5\n"),
        ("fake_gpus inf", "fake_gpus = inf\n"),
        ("fake_gpu_power_w nan", "fake_gpu_power_w = nan\n"),
        ("fake_gpu_power_w inf", "fake_gpu_power_w = inf\n"),
        ("fake_gpu_power_w 1e308", "fake_gpu_power_w = 1e308\n"),
        ("daemon_interval_s nan", "daemon_interval_s = nan\n"),
        ("daemon_interval_s inf", "daemon_interval_s = inf\n"),
        ("daemon_interval_s 0", "daemon_interval_s = 0\n"),
        ("daemon_interval_s 1e308", "daemon_interval_s = 1e308\n"),
        ("daemon_interval_s 1e-9", "daemon_interval_s = 1e-9\n"),
        ("cancel_grace_s nan", "cancel_grace_s = nan\n"),
        ("cancel_grace_s inf", "cancel_grace_s = inf\n"),
        ("cancel_grace_s 1e308", "cancel_grace_s = 1e308\n"),
        ("cancel_grace_s -1", "cancel_grace_s = -1\n"),
        ("grid.timeout_s nan", "[grid]\ntimeout_s = nan\n"),
        ("grid.timeout_s inf", "[grid]\ntimeout_s = inf\n"),
        ("grid.timeout_s 1e308", "[grid]\ntimeout_s = 1e308\n"),
        ("grid.retries 11", "[grid]\nretries = 11\n"),
        ("daemon.slot 0.5s", '[daemon]\nslot = "0.5s"\n'),
        ("daemon.slot 2h", '[daemon]\nslot = "2h"\n'),
        ("daemon.slot nines", f'[daemon]\nslot = "{NINES}s"\n'),
        ("daemon.refresh 0s", '[daemon]\nrefresh = "0s"\n'),
        ("daemon.refresh huge", '[daemon]\nrefresh = "99999999w"\n'),
        ("daemon.signal_max_age huge", f'[daemon]\nsignal_max_age = "{NINES}s"\n'),
        ("daemon.power_sample huge", '[daemon]\npower_sample = "99999999w"\n'),
        ("daemon.discovery huge", '[daemon]\ndiscovery = "1000000w"\n'),
        ("daemon.lease huge", '[daemon]\nlease = "1000000w"\n'),
        ("daemon.metrics_port 0", "[daemon]\nmetrics_port = 0\n"),
        ("daemon.metrics_port 70000", "[daemon]\nmetrics_port = 70000\n"),
        ("daemon.budget inf", '[daemon]\nbudget = "infkg/day"\n'),
        ("daemon.budget huge", f'[daemon]\nbudget = "{NINES}kg/day"\n'),
        ("daemon.policy x", '[daemon]\nsuspend = "pause"\n'),
        ("node gpus 1e8", '[[nodes]]\nname = "a"\ngpus = 100000000\n'),
        ("node fake_gpus 1e8", '[[nodes]]\nname = "a"\nfake_gpus = 100000000\n'),
        ("node gpus -1", '[[nodes]]\nname = "a"\ngpus = -1\n'),
        ("node port 0", '[[nodes]]\nname = "a"\nexecutor = "ssh"\nhost = "h"\nport = 0\n'),
        (
            "node islands overlap",
            '[[nodes]]\nname = "a"\ngpus = 4\nnvlink_islands = [[0, 1], [1, 2]]\n',
        ),
        ("node islands past gpus", '[[nodes]]\nname = "a"\ngpus = 2\nnvlink_islands = [[0, 5]]\n'),
        (
            "node islands negative",
            '[[nodes]]\nname = "a"\ngpus = 2\nnvlink_islands = [[-1, 0]]\n',
        ),
        ("node islands empty", '[[nodes]]\nname = "a"\ngpus = 2\nnvlink_islands = [[]]\n'),
        ("node islands miss gpus", '[[nodes]]\nname = "a"\ngpus = 4\nnvlink_islands = [[0, 1]]\n'),
        ("node islands huge", f'[[nodes]]\nname = "a"\ngpus = 2\nnvlink_islands = [[0, {BIG}]]\n'),
        ("node name empty", '[[nodes]]\nname = ""\ngpus = 2\n'),
        ("node name NUL", '[[nodes]]\nname = "a\\u0000b"\ngpus = 2\n'),
        ("node name newline", '[[nodes]]\nname = "a\\nb"\ngpus = 2\n'),
        (
            "node time_margin nan",
            '[[nodes]]\nname = "c"\nexecutor = "slurm"\ngpus = 4\ntime_margin = nan\n',
        ),
        (
            "node time_margin inf",
            '[[nodes]]\nname = "c"\nexecutor = "slurm"\ngpus = 4\ntime_margin = inf\n',
        ),
        (
            "node connect_timeout huge",
            f'[[nodes]]\nname = "s"\nexecutor = "ssh"\nhost = "h"\nconnect_timeout = "{NINES}s"\n',
        ),
        (
            "node lost_after 0s",
            '[[nodes]]\nname = "s"\nexecutor = "ssh"\nhost = "h"\nlost_after = "0s"\n',
        ),
        ("node executor docker", '[[nodes]]\nname = "a"\nexecutor = "docker"\n'),
        ("two nodes same name", '[[nodes]]\nname = "a"\ngpus = 1\n[[nodes]]\nname = "a"\n'),
        ("invalid UTF-8", b"fake_gpus = 4\n# caf\xe9\n"),
        ("NUL byte", b"fake_gpus = 4\x00\n"),
        ("deep array", "x = " + "[" * 100_000 + "]" * 100_000 + "\n"),
        ("deep inline table", "x = " + "{a = " * 5_000 + "1" + "}" * 5_000 + "\n"),
        ("unknown table", "[frobnicate]\na = 1\n"),
        ("not TOML", "fake_gpus: 4\n"),
        *issue24_config_toml(),
    ]
    out = [Case(c, n, ["nodes"], {"gridshift.toml": t}) for n, t in toml]
    envs: list[tuple[str, dict[str, str]]] = [
        ("GRIDSHIFT_NODES not JSON", {"GRIDSHIFT_NODES": "not json"}),
        ("GRIDSHIFT_NODES deep JSON", {"GRIDSHIFT_NODES": "[" * 100_000 + "]" * 100_000}),
        ("GRIDSHIFT_DAEMON not JSON", {"GRIDSHIFT_DAEMON": "{"}),
        ("GRIDSHIFT_GRID not JSON", {"GRIDSHIFT_GRID": "["}),
        ("GRIDSHIFT_FAKE_GPUS abc", {"GRIDSHIFT_FAKE_GPUS": "abc"}),
        ("GRIDSHIFT_FAKE_GPUS 1e8", {"GRIDSHIFT_FAKE_GPUS": "100000000"}),
        ("GRIDSHIFT_FAKE_GPUS huge", {"GRIDSHIFT_FAKE_GPUS": NINES}),
        ("GRIDSHIFT_DAEMON_INTERVAL_S nan", {"GRIDSHIFT_DAEMON_INTERVAL_S": "nan"}),
        ("GRIDSHIFT_DAEMON_INTERVAL_S inf", {"GRIDSHIFT_DAEMON_INTERVAL_S": "inf"}),
        ("GRIDSHIFT_CANCEL_GRACE_S nan", {"GRIDSHIFT_CANCEL_GRACE_S": "nan"}),
        ("GRIDSHIFT_DAEMON__SLOT 0s", {"GRIDSHIFT_DAEMON__SLOT": "0s"}),
        ("GRIDSHIFT_GRID__TIMEOUT_S inf", {"GRIDSHIFT_GRID__TIMEOUT_S": "inf"}),
        (
            "GRIDSHIFT_NODES islands",
            {"GRIDSHIFT_NODES": json.dumps([{"name": "a", "gpus": 2, "nvlink_islands": [[0, 0]]}])},
        ),
    ]
    envs += [
        ("GRIDSHIFT_DAEMON__POWER_LIMIT 15kWh", {"GRIDSHIFT_DAEMON__POWER_LIMIT": "15kWh"}),
        ("GRIDSHIFT_DAEMON__POWER_LIMIT 0", {"GRIDSHIFT_DAEMON__POWER_LIMIT": "0"}),
        ("GRIDSHIFT_DAEMON__PUE nan", {"GRIDSHIFT_DAEMON__PUE": "nan"}),
        ("GRIDSHIFT_DAEMON__PUE 0.5", {"GRIDSHIFT_DAEMON__PUE": "0.5"}),
        (
            "GRIDSHIFT_NODES share x",
            {"GRIDSHIFT_NODES": json.dumps([{"name": "a", "fake_gpus": 2, "share": "x"}])},
        ),
        (
            "GRIDSHIFT_NODES pue true",
            {"GRIDSHIFT_NODES": json.dumps([{"name": "a", "fake_gpus": 2, "pue": True}])},
        ),
        (
            "GRIDSHIFT_NODES power_off relative",
            {"GRIDSHIFT_NODES": json.dumps([{**SSH_NODE, **POWER, "power_off": ["ipmitool"]}])},
        ),
    ]
    out += [Case(c, n, ["nodes"], env=e) for n, e in envs]
    out += issue24_trust_cases()
    out += [
        Case(c, "--config /dev/zero", ["--config", "/dev/zero", "nodes"]),
        Case(c, "--config a directory", ["--config", "/", "nodes"]),
    ]
    return out


SSH_NODE = {"name": "s", "executor": "ssh", "host": "h"}
POWER = {"power_off": ["/bin/true"], "power_on": ["/bin/true"], "idle_off_after": "30m"}


def _toml(table: dict) -> str:
    """One ``[[nodes]]`` table (values as JSON, which TOML reads alike for these)."""
    return "[[nodes]]\n" + "".join(f"{k} = {_tv(v)}\n" for k, v in table.items())


def _tv(v) -> str:
    """A TOML value: lists, tables, quoted strings and nan/inf as written, the rest as JSON."""
    raw = isinstance(v, str) and (v[:1] in ("[", "{", '"') or v in ("nan", "inf", "-inf"))
    return v if raw else json.dumps(v)


def issue24_config_toml() -> list[tuple[str, str]]:
    """Issue 24's node keys (co-location, idle power, right-sizing) and [daemon] pue and
    power_limit."""
    local = {"name": "a", "fake_gpus": 2}
    slurm = {"name": "c", "executor": "slurm", "gpus": 4}
    ssh_power = {**SSH_NODE, **POWER}
    out: list[tuple[str, str]] = []

    def node(name: str, base: dict, **extra) -> None:
        out.append((name, _toml({**base, **extra})))

    for v in ("always", "MPS", "", "time_slice", "true", True, 1, "[]"):
        node(f"node share {v!r}", local, share=v)
    for v in ("all", "", "SAME", True, "[]"):
        node(f"node share_users {v!r}", local, share="time-slice", share_users=v)
    node("node share on a slurm node", slurm, share="time-slice")
    node("node share mps, share_users any", local, share="mps", share_users="any")
    for k in ("gpu_idle_w", "node_idle_w"):
        for v in (-1, "nan", "inf", 1e9, "50W", True):
            node(f"node {k} {v!r}", local, **{k: v})
    for v in (0.5, 0, -1, "nan", "inf", 6, "1.2x", True):
        node(f"node pue {v!r}", local, pue=v)
    node("node gpu_idle_w on a slurm node", slurm, gpu_idle_w=30)
    node("node pue on a slurm node", slurm, pue=1.2)
    for v in ("0s", "-1h", "nan", NINES + "s", "never", "99999999w", 30, "[]"):
        node(f"node idle_off_after {str(v)[:20]!r}", ssh_power, idle_off_after=v)
    for k in ("power_timeout", "wake", "wake_timeout"):
        for v in ("0s", "nan", NINES + "s", "soon", 60):
            node(f"node {k} {str(v)[:20]!r}", ssh_power, **{k: v})
    node("node wake_timeout shorter than wake", ssh_power, wake="10m", wake_timeout="5m")
    node("node power_timeout past wake_timeout", ssh_power, power_timeout="20m")
    for k in ("power_off", "power_on"):
        for v in (
            '["ipmitool", "power", "soft"]',
            '["./off.sh"]',
            '["bin/true"]',
            "[]",
            '"/bin/true"',
            "[1]",
            '["/bin/true", 5]',
            '["/bin/tr\\u0000ue"]',
            json.dumps(["/bin/true"] + ["x"] * 64),
            json.dumps(["/bin/true", "x" * 5000]),
            '["/nonexistent/ipmitool"]',
            '[""]',
        ):
            node(f"node {k} {v[:24]}", ssh_power, **{k: v})
    node("node power_off without power_on", SSH_NODE, power_off='["/bin/true"]')
    node("node idle_off_after without commands", SSH_NODE, idle_off_after="30m")
    node("node power_off on a local node", local, power_off='["/bin/true"]',
         power_on='["/bin/true"]')  # fmt: skip
    node("node right-sizing on a slurm node", slurm, **POWER)
    node("node gpu (the simulator's key)", local, gpu="v100")
    for v in ("15kWh", "0W", "0", "-1kW", "nan", "inf", True, "2GW", "", "15 kW h", "[15]"):
        out.append((f"daemon.power_limit {v!r}", f"[daemon]\npower_limit = {_tv(v)}\n"))
    for v in (0.5, 0, "nan", "inf", 5.5, "high", True):
        out.append((f"daemon.pue {v!r}", f"[daemon]\npue = {_tv(v)}\n"))
    for v in ("sideways", "empty_servers", "", 2, 0.5, "[]"):
        out.append((f"daemon.moves {v!r}", f"[daemon]\nmoves = {_tv(v)}\n"))
    return out


def issue24_trust_cases() -> list[Case]:
    """Power commands run as root: a root daemon refuses a program, or a config naming
    one, that others than root may change (checked only as root: a user's own daemon runs
    what its user may write anyway; so these cases are tried only as root)."""
    if os.geteuid() != 0:
        return []
    c = "config"
    script = "#!/bin/sh\nexit 0\n"

    def with_program(path: str) -> str:
        return _toml({**SSH_NODE, **POWER, "power_on": [f"@HOME@/{path}"]})

    good = _toml({**SSH_NODE, **POWER})
    return [
        Case(c, "power_on program other-writable", ["nodes"],
             {"gridshift.toml": with_program("on.sh"), "on.sh": script}, modes={"on.sh": 0o777}),
        Case(c, "power_on program group-writable", ["nodes"],
             {"gridshift.toml": with_program("on.sh"), "on.sh": script}, modes={"on.sh": 0o775}),
        Case(c, "power_on program not root's", ["nodes"],
             {"gridshift.toml": with_program("on.sh"), "on.sh": script}, modes={"on.sh": 0o755},
             owners={"on.sh": 65534}),
        Case(c, "power_on program in an other-writable folder", ["nodes"],
             {"gridshift.toml": with_program("bin/on.sh"), "bin/on.sh": script},
             modes={"bin/on.sh": 0o755, "bin": 0o777}),
        Case(c, "power_on program: a link to one not root's", ["nodes"],
             {"gridshift.toml": with_program("on.sh"), "real.sh": script},
             modes={"real.sh": 0o755}, owners={"real.sh": 65534}, links={"on.sh": "real.sh"}),
        Case(c, "power commands in an other-writable config", ["nodes"],
             {"gridshift.toml": good}, modes={"gridshift.toml": 0o666}),
        Case(c, "power commands in a config not root's", ["nodes"],
             {"gridshift.toml": good}, owners={"gridshift.toml": 65534}),
    ]  # fmt: skip


def _csv(rows: list[tuple[str, str]], header: str = "time,carbon") -> str:
    return header + "\n" + "".join(f"{t},{v}\n" for t, v in rows)


def _hourly(values: list[str]) -> list[tuple[str, str]]:
    from datetime import UTC, datetime, timedelta

    start = datetime(2023, 1, 1, tzinfo=UTC)
    return [
        ((start + timedelta(hours=h)).strftime("%Y-%m-%dT%H:%M:%SZ"), v)
        for h, v in enumerate(values)
    ]


def grid_cases() -> list[Case]:
    c = "grid-csv"
    ok = ["200"] * 6
    far = [(f"2023-01-01T00:00:{s:02d}Z", "200") for s in range(10)] + [("2026-01-01T00:00Z", "1")]
    files: list[tuple[str, str | bytes, str]] = [
        ("negative value", _csv(_hourly(["200", "-5", "200", "200"])), ""),
        ("inf value", _csv(_hourly(["200", "inf", "200", "200"])), ""),
        ("-inf value", _csv(_hourly(["200", "-inf", "200", "200"])), ""),
        ("1e400 value", _csv(_hourly(["200", "1e400", "200", "200"])), ""),
        ("all nan", _csv(_hourly(["nan"] * 4)), ""),
        ("ten 1 s rows then 3 years", _csv(far), ""),
        (
            "1 s resolution over a year",
            _csv([*_hourly(ok), ("2024-01-01T00:00Z", "1")]),
            "?resolution=1",
        ),
        ("resolution 0", _csv(_hourly(ok)), "?resolution=0"),
        ("resolution huge", _csv(_hourly(ok)), f"?resolution={HUGE}h"),
        ("year 3000", _csv([("2023-01-01T00:00Z", "1"), ("3000-01-01T00:00Z", "2")]), ""),
        ("year 1000", _csv([("1000-01-01T00:00Z", "1"), ("2023-01-01T00:00Z", "2")]), ""),
        (
            "year 1700 to 2200",
            _csv(
                [("1700-01-01T00:00Z", "1"), ("1700-01-01T01:00Z", "1"), ("2200-01-01T00:00Z", "2")]
            ),
            "",
        ),
        ("one row", _csv(_hourly(["200"])), ""),
        ("header only", "time,carbon\n", ""),
        ("empty file", "", ""),
        ("garbage times", _csv([("x", "1"), ("y", "2")]), ""),
        ("numeric times", _csv([("1e20", "1"), ("2e20", "2")]), ""),
        ("latin-1 bytes", b"time,carbon\n2023-01-01T00:00Z,1\ncaf\xe9,2\n", ""),
        ("binary garbage", bytes(range(256)) * 4, ""),
        ("NUL bytes", b"time,carbon\n2023-01-01T00:00Z,1\x00\n2023-01-01T01:00Z,2\n", ""),
        ("tz unknown", _csv([(t[:-1], v) for t, v in _hourly(ok)]), "?tz=Mars/Olympus"),
        ("tz path", _csv([(t[:-1], v) for t, v in _hourly(ok)]), "?tz=../../etc/passwd"),
        ("unknown column", _csv(_hourly(ok)), "?column=nope"),
        ("unknown option", _csv(_hourly(ok)), "?colour=green"),
        ("price inf", _csv(_hourly(["50", "inf", "50"])), "?quantity=price"),
        ("huge value", _csv(_hourly(["200", "1e300", "200"])), ""),
    ]
    out = []
    for name, text, query in files:
        out.append(
            Case(
                c,
                f"grid show: {name}",
                ["grid", "show", "--json", "--source", f"csv:trace.csv{query}"],
                {"trace.csv": text},
            )
        )
    for name, text, query in files[:8]:
        out.append(
            Case(
                c,
                f"grid fetch: {name}",
                ["grid", "fetch", "--source", f"csv:trace.csv{query}"],
                {"trace.csv": text},
            )
        )
    good = {"trace.csv": _csv(_hourly(["200"] * 24))}
    for name, args in (
        ("window huge", ["--window", NINES + "s"]),
        ("window 0s", ["--window", "0s"]),
        ("horizon huge", ["--forecast", "--horizon", "99999999w"]),
        ("start year 10000", ["--start", "+10000-01-01"]),
        ("end year 0", ["--end", "0000-01-01"]),
        ("start garbage", ["--start", "soon"]),
        ("start offset +25", ["--start", "2023-01-01T00:00+25:00"]),
        ("start after end", ["--start", "2023-01-02", "--end", "2023-01-01"]),
    ):
        out.append(
            Case(
                c,
                f"grid show {name}",
                ["grid", "show", "--json", "--source", "csv:trace.csv", *args],
                good,
            )
        )
    out.append(
        Case(
            c,
            "daemon on a 94.7 M point trace",
            ["daemon", "--until-idle", "--grid", "csv:trace.csv"],
            {"trace.csv": _csv(far)},
        )
    )
    out.append(
        Case(
            c,
            "daemon on a negative trace",
            ["daemon", "--until-idle", "--grid", "csv:trace.csv"],
            {"trace.csv": _csv(_hourly(["200", "-5", "200", "200"]))},
        )
    )
    return out


GRID_FILE = {"grid.csv": _csv(_hourly(["200", "100", "300"] * 40))}
#: ``simulate`` of jobs.jsonl on grid.csv under fifo, printing JSON (the controls')
SIMULATE_FIFO = ["simulate", "--json", "--policy", "fifo", "--jobs", "jobs.jsonl",
                 "--grid", "csv:grid.csv"]  # fmt: skip


def _sim(name: str, argv: list[str], files: dict) -> Case:
    return Case(
        "simulate", name, ["simulate", "--json", "--policy", "fifo", *argv], {**GRID_FILE, **files}
    )


def sim_cases() -> list[Case]:
    out = []
    rows = [
        ("duration NaN", '{"submit": 0, "duration": NaN}'),
        ("duration Infinity", '{"submit": 0, "duration": Infinity}'),
        ("duration 1e309", '{"submit": 0, "duration": 1e309}'),
        ("duration 0", '{"submit": 0, "duration": 0}'),
        ("duration huge", '{"submit": 0, "duration": 1e300}'),
        ("duration nines", f'{{"submit": 0, "duration": "{NINES}s"}}'),
        ("submit NaN", '{"submit": NaN, "duration": 60}'),
        ("submit Infinity", '{"submit": Infinity, "duration": 60}'),
        ("submit 1e300", '{"submit": 1e300, "duration": 60}'),
        ("submit -1e300", '{"submit": -1e300, "duration": 60}'),
        ("submit year 9999", '{"submit": "9999-12-31T23:59:59-14:00", "duration": 60}'),
        ("submit year 1", '{"submit": "0001-01-01T00:00:00+14:00", "duration": 60}'),
        ("gpus 2**70", f'{{"submit": 0, "duration": 60, "gpus": {2**70}}}'),
        ("gpus 1.5", '{"submit": 0, "duration": 60, "gpus": 1.5}'),
        ("gpus -1", '{"submit": 0, "duration": 60, "gpus": -1}'),
        ("gpus NaN", '{"submit": 0, "duration": 60, "gpus": NaN}'),
        ("priority 2**70", f'{{"submit": 0, "duration": 60, "priority": {2**70}}}'),
        ("priority x", '{"submit": 0, "duration": 60, "priority": "x"}'),
        ("priority 1.9", '{"submit": 0, "duration": 60, "priority": 1.9}'),
        ("within huge", '{"submit": 0, "duration": 60, "within": "99999999w"}'),
        ("within NaN", '{"submit": 0, "duration": 60, "within": NaN}'),
        ("deadline 1e300", '{"submit": 0, "duration": 60, "deadline": 1e300}'),
        ("deadline before end", '{"submit": 0, "duration": 7200, "deadline": 3600}'),
        ("interruptible maybe", '{"submit": 0, "duration": 60, "interruptible": "maybe"}'),
        ("deep line", "[" * 100_000 + "]" * 100_000),
        ("lone surrogate name", '{"submit": 0, "duration": 60, "name": "\\ud800"}'),
    ]
    for name, line in rows:
        out.append(
            _sim(
                f"specs: {name}",
                ["--jobs", "jobs.jsonl", "--grid", "csv:grid.csv"],
                {"jobs.jsonl": line + "\n"},
            )
        )
    csvs = [
        ("philly duration inf", "timestamp,duration,num_gpus\n2023-01-01T00:00Z,inf,1\n"),
        ("philly gpus 1e30", "timestamp,duration,num_gpus\n2023-01-01T00:00Z,60,1e30\n"),
        ("philly time garbage", "timestamp,duration,num_gpus\nsoon,60,1\n"),
        ("philly year 3000", "timestamp,duration,num_gpus\n3000-01-01T00:00Z,60,1\n"),
        ("tiresias submit inf", "job_id,num_gpu,submit_time,duration\n1,1,inf,60\n"),
        ("tiresias submit -1e300", "job_id,num_gpu,submit_time,duration\n1,1,-1e300,60\n"),
        ("tiresias gpus 2**70", f"job_id,num_gpu,submit_time,duration\n1,{2**70},0,60\n"),
        ("tiresias duration 1e300", "job_id,num_gpu,submit_time,duration\n1,1,0,1e300\n"),
        ("specs csv duration nan", "submit,duration\n0,nan\n"),
        ("specs csv priority x", "submit,duration,priority\n0,60,x\n"),
    ]
    for name, text in csvs:
        out.append(
            _sim(
                f"trace: {name}",
                ["--jobs", "jobs.csv", "--grid", "csv:grid.csv"],
                {"jobs.csv": text},
            )
        )
    good_jobs = {"jobs.jsonl": '{"submit": 0, "duration": 3600}\n'}
    base = ["--jobs", "jobs.jsonl", "--grid", "csv:grid.csv"]
    scen = [
        ("timezone Mars", 'timezone = "Mars/Olympus"\n'),
        ("slot 0s", 'slot = "0s"\n'),
        ("slot nines", f'slot = "{NINES}s"\n'),
        ("max_defer nines", f'max_defer = "{NINES}s"\n'),
        ("max_defer huge", 'max_defer = "99999999w"\n'),
        ("time_limit 0s", 'time_limit = "0s"\n'),
        ("time_limit huge", 'time_limit = "99999999w"\n'),
        ("seed -1", "seed = -1\n"),
        ("seed 2**70", f"seed = {2**70}\n"),
        ("forecast noise nan", 'forecast = "noise:nan"\n'),
        ("forecast noise inf", 'forecast = "noise:inf"\n'),
        ("forecast noise -1", 'forecast = "noise:-1"\n'),
        ("objective mix nan", 'objective = "mix:nan"\n'),
        ("budget nan", 'budget = "nankg/day"\n'),
        ("power_limit_w inf", "power_limit_w = inf\n"),
        ("power_limit_w nan", "power_limit_w = nan\n"),
        ("deadline_rule huge", '[jobs]\ndeadline_rule = "within:99999999w"\n'),
        ("deadline_rule nan", '[jobs]\ndeadline_rule = "within:nan"\n'),
        ("cluster host_w_per_gpu inf", "[cluster]\nhost_w_per_gpu = inf\n"),
        (
            "cluster islands overlap",
            '[cluster]\nnodes = [{name = "a", gpus = 4, nvlink_islands = [[0, 1], [1, 2]]}]\n',
        ),
        ("cluster node gpus huge", f'[cluster]\nnodes = [{{name = "a", gpus = {2**40}}}]\n'),
        (
            "grid start after end",
            "[grid]\nstart = 2023-01-03T00:00:00Z\nend = 2023-01-02T00:00:00Z\n",
        ),
        ("synthetic count huge", f'[jobs]\nsource = "synthetic:count={HUGE}"\n'),
        ("synthetic days huge", '[jobs]\nsource = "synthetic:count=5&days=99999999"\n'),
        ("grid synthetic days huge", '[grid]\nsource = "synthetic:days=99999999"\n'),
        ("deep toml", "x = " + "[" * 100_000 + "]" * 100_000 + "\n"),
        ("invalid UTF-8", b"name = 'caf\xe9'\n"),
    ]
    for name, text in scen:
        argv = base if "source" not in str(text) else ["--grid", "csv:grid.csv"]
        if "[grid]\nsource" in str(text):
            argv = ["--jobs", "jobs.jsonl"]
        out.append(_sim(f"scenario: {name}", ["s.toml", *argv], {"s.toml": text, **good_jobs}))
    for name, args in (
        ("--seed -1", ["--seed", "-1"]),
        ("--power-limit inf", ["--power-limit", "inf"]),
        ("--power-limit nan", ["--power-limit", "nan"]),
        ("--interruptible nan", ["--interruptible", "nan"]),
        ("--elastic nan", ["--elastic", "nan"]),
        ("--slot huge", ["--slot", "99999999w"]),
        ("--max-jobs 0", ["--max-jobs", "0"]),
        ("grid negative", ["--grid", "csv:neg.csv"]),
        ("grid 94.7 M points", ["--grid", "csv:far.csv"]),
    ):
        files = {**good_jobs, "neg.csv": _csv(_hourly(["200", "-5"] * 10)), "far.csv": GRID_FAR}
        argv = [*base, *args] if "--grid" not in args else ["--jobs", "jobs.jsonl", *args]
        out.append(_sim(f"flag: {name}", argv, files))
    return out + issue24_sim_cases()


MIXED = (ROOT / "examples" / "mixed_cluster.toml").read_text()


def issue24_sim_cases() -> list[Case]:
    """Issue 24's simulate inputs: --power-limit, --share, --cluster, and the scenario's
    co-location, model, GPU type and idle-power keys."""
    good_jobs = {"jobs.jsonl": '{"submit": 0, "duration": 3600}\n'}
    base = ["--jobs", "jobs.jsonl", "--grid", "csv:grid.csv"]
    out = []
    for p in [*BAD_POWERS[:12], "1W", "0.5W"]:  # 1W, 0.5W: less than the cluster draws idle
        out.append(_sim(f"flag: --power-limit {p[:20]!r}", [*base, "--power-limit", p], good_jobs))
    for v in ("nan", "inf", "-inf", "1.5", "-0.1", "x", "", "1e400", "½"):
        out.append(_sim(f"flag: --share {v!r}", [*base, "--share", v], good_jobs))
    scen = [
        *[(f"jobs.share {v}", f"[jobs]\nshare = {v}\n")
          for v in ("1.5", "-0.1", "nan", "inf", '"half"', "true", "[0.5]")],
        *[(f"jobs.moves {v}", f"[jobs]\nmoves = {v}\n")
          for v in ('"sideways"', '"empty_servers"', '"true"', '""', "1", "0.5", '["x"]')],
        *[(f"jobs.models {v}", f"[jobs]\nmodels = {v}\n")
          for v in ('"Gavel"', '"all"', '""', "1", "true", '["gavel"]')],
        *[(f"cluster.idle_off_after {v[:20]}", f"[cluster]\nidle_off_after = {v}\n")
          for v in ('"0s"', '"-1m"', '"nan"', f'"{NINES}s"', "30", '"Never"', '"99999999w"')],
        *[(f"cluster.wake {v[:20]}", f"[cluster]\nwake = {v}\n")
          for v in ('"never"', '"0s"', '"99999999w"', "300", '""')],
        *[(f"cluster.{k} {v}", f"[cluster]\n{k} = {v}\n")
          for k in ("node_idle_w", "gpu_idle_w")
          for v in ("-1", "nan", "inf", "1e9", '"150W"', "true")],
        *[(f"cluster.gpu {v[:20]}", f"[cluster]\ngpu = {v}\n")
          for v in ('"!!!"', '""', '"   "', '"NVIDIA"', json.dumps("x" * 65), "100", "true")],
        *[(f"cluster.nodes gpu {v[:20]}",
           f"[cluster]\nnodes = [{{name = \"a\", gpus = 4, gpu = {v}}}]\n")
          for v in ('"!!!"', '""', '"tesla"', "5", json.dumps("x" * 65))],
        *[(f"cluster.nodes {k} {v}",
           f"[cluster]\nnodes = [{{name = \"a\", gpus = 4, {k} = {v}}}]\n")
          for k, v in (("gpu_idle_w", "-1"), ("node_idle_w", "nan"), ("wake", '"0s"'),
                       ("wake", '"never"'), ("idle_off_after", '"nan"'), ("gpu_model", "5"))],
        ("cluster.nodes without gpus", '[cluster]\nnodes = [{name = "a", gpu = "v100"}]\n'),
        ("cluster.pue 0.5", "[cluster]\npue = 0.5\n"),
        ("cluster.pue nan", "[cluster]\npue = nan\n"),
        ("cluster.pue true", "[cluster]\npue = true\n"),
        ("cluster.nodes gpu_idle_w true",
         '[cluster]\nnodes = [{name = "a", gpus = 4, gpu_idle_w = true}]\n'),
        ("jobs.interruptible true", "[jobs]\ninterruptible = true\n"),
        ("jobs.elastic true", "[jobs]\nelastic = true\n"),
        ("power_limit_w 15kWh", 'power_limit_w = "15kWh"\n'),
        ("power_limit_w 0", "power_limit_w = 0\n"),
        ("power_limit_w -15kW", 'power_limit_w = "-15kW"\n'),
        ("power_limit_w true", "power_limit_w = true\n"),
        ("power_limit_w 1W (below idle)", 'power_limit_w = "1W"\n'),
    ]  # fmt: skip
    for name, text in scen:
        out.append(_sim(f"scenario: {name}", ["s.toml", *base], {"s.toml": text, **good_jobs}))
    clusters = [
        ("missing file", None),
        ("not TOML", "[cluster\n"),
        ("empty", ""),
        ("only a comment", "# nothing\n"),
        ("cluster is a number", "cluster = 5\n"),
        ("cluster is a string", 'cluster = "v100"\n'),
        ("cluster is a list", "cluster = [1, 2]\n"),
        ("nodes is a number", "nodes = 5\n"),
        ("nodes is a string", 'nodes = "a"\n'),
        ("nodes hold a number", "nodes = [5]\n"),
        ("node gpu !!!", '[[nodes]]\nname = "a"\ngpus = 8\ngpu = "!!!"\n'),
        ("node gpus -1", '[[nodes]]\nname = "a"\ngpus = -1\n'),
        ("node without gpus", '[[nodes]]\nname = "a"\ngpu = "v100"\n'),
        ("node without name", '[[nodes]]\ngpus = 8\n'),
        ("mixed, one node gpu !!!", MIXED.replace('gpu = "p100"', 'gpu = "!!!"', 1)),
        ("mixed, cluster gpu empty", MIXED.replace('gpu = "v100"', 'gpu = ""', 1)),
        ("mixed, pue 9", MIXED.replace("pue = 1.2", "pue = 9")),
        ("mixed, unknown cluster key", MIXED.replace("pue = 1.2", "pue = 1.2\ncolour = 1")),
        ("invalid UTF-8", b"[cluster]\ngpu = 'caf\xe9'\n"),
        ("deep array", "x = " + "[" * 100_000 + "]" * 100_000 + "\n"),
    ]  # fmt: skip
    for name, text in clusters:
        files = dict(good_jobs) if text is None else {"cluster.toml": text, **good_jobs}
        argv = [*base, "--cluster", "cluster.toml"]
        out.append(_sim(f"--cluster: {name}", argv, files))
    for name, line in (
        ("the only job asks for a100", '{"submit": 0, "duration": 3600, "gpu_type": "a100"}'),
        ("the only job wider than 16 V100s",
         '{"submit": 0, "duration": 3600, "gpu_type": "v100", "gpus": 17}'),
        ("a job's gpu_type '!!!'", '{"submit": 0, "duration": 3600, "gpu_type": "!!!"}'),
        ("a job's gpu_type 5", '{"submit": 0, "duration": 3600, "gpu_type": 5}'),
    ):  # fmt: skip
        out.append(
            _sim(f"--cluster mixed: {name}", [*base, "--cluster", "c.toml"],
                 {"c.toml": MIXED, "jobs.jsonl": line + "\n"})
        )  # fmt: skip
    out.append(_sim("--cluster: a directory", [*base, "--cluster", "/"], good_jobs))
    out.append(_sim("--cluster: /dev/zero", [*base, "--cluster", "/dev/zero"], good_jobs))
    out.append(
        _sim("--cluster with --gpus", [*base, "--cluster", "c.toml", "--gpus", "8"],
             {"c.toml": MIXED, **good_jobs})
    )  # fmt: skip
    return out


GRID_FAR = _csv(
    [(f"2023-01-01T00:00:{s:02d}Z", "200") for s in range(10)] + [("2026-01-01T00:00Z", "1")]
)


def tz_cases() -> list[Case]:
    c = "timezone"
    out = []
    naive = _csv([(f"2023-01-01T{h:02d}:00:00", "200") for h in range(6)])
    good_jobs = {"jobs.jsonl": '{"submit": 0, "duration": 3600}\n', **GRID_FILE}
    for tz in (
        "Mars/Olympus",
        "",
        "../../../etc/passwd",
        "/etc/localtime",
        "UTC\x00",
        "Europe/Berlin/",
        "x" * 5000,
        "+25:00",
        "Etc/GMT+99",
        "Europe",
    ):
        out.append(
            Case(
                c,
                f"scenario timezone {tz[:20]!r}",
                [
                    "simulate",
                    "--json",
                    "--policy",
                    "fifo",
                    "s.toml",
                    "--jobs",
                    "jobs.jsonl",
                    "--grid",
                    "csv:grid.csv",
                ],
                {"s.toml": f"timezone = {json.dumps(tz)}\n", **good_jobs},
            )
        )
        if "\x00" not in tz:
            out.append(
                Case(
                    c,
                    f"csv tz {tz[:20]!r}",
                    ["grid", "show", "--json", "--source", f"csv:t.csv?tz={tz}"],
                    {"t.csv": naive},
                )
            )
    for off in ("+99:00", "+24:00", "-24:00", "+14:01:00.5x", "Z+01:00", "+1:00"):
        out.append(
            Case(
                c,
                f"deadline offset {off}",
                ["submit", "--deadline", f"2030-01-01T00:00{off}", "--", "true"],
            )
        )
    for tz in ("Mars/Olympus", ":/nonexistent", "../../etc/passwd"):
        out.append(
            Case(
                c,
                f"TZ={tz} with --cron",
                [
                    "submit",
                    "--cron",
                    "0 2 * * *",
                    "--window",
                    "8h",
                    "--duration",
                    "9h",
                    "--",
                    "true",
                ],
                env={"TZ": tz},
            )
        )
    return out


def controls() -> list[Case]:
    """Good inputs that must keep working."""
    c = "controls"
    line = {
        "command": ["true"],
        "gpus": 4,
        "duration": 7200,
        "interruptible": False,
        "priority": 3,
        "env": {"K": "v"},
        "within": "12h",
        "labels": ["a"],
    }
    return [
        Case(c, "--duration 2h", ["submit", "--duration", "2h", "--", "true"], expect=0),
        Case(c, "--within 52w", ["submit", "--within", "52w", "--", "true"], expect=0),
        Case(c, "--within 0s", ["submit", "--within", "0s", "--", "true"], expect=0),
        Case(c, "--now", ["submit", "--now", "--", "true"], expect=0),
        Case(
            c,
            "sweep line within 0s",
            ["submit", "--file", "j.jsonl"],
            {"j.jsonl": json.dumps({"command": ["true"], "within": "0s"})},
            expect=0,
        ),
        Case(
            c,
            "--gpus 2-4 --priority -5",
            ["submit", "--gpus", "2-4", "--priority", "-5", "--", "true"],
            expect=0,
        ),
        Case(
            c,
            "sweep line",
            ["submit", "--file", "j.jsonl"],
            {"j.jsonl": json.dumps(line)},
            expect=0,
        ),
        Case(
            c,
            "grid show",
            ["grid", "show", "--json", "--source", "csv:grid.csv"],
            GRID_FILE,
            expect=0,
        ),
        Case(
            c,
            "simulate",
            SIMULATE_FIFO,
            {"jobs.jsonl": '{"submit": 0, "duration": 3600}\n', **GRID_FILE},
            expect=0,
        ),
        Case(
            c, "cron", ["submit", "--cron", "0 2 * * *", "--window", "8h", "--", "true"], expect=0
        ),
        *issue24_controls(),
        Case(
            c,
            "nodes with islands",
            ["nodes"],
            {
                "gridshift.toml": '[[nodes]]\nname = "a"\n'
                "fake_gpus = 4\nnvlink_islands = [[0, 1], [2, 3]]\n"
            },
            expect=0,
        ),
    ]


def issue24_controls() -> list[Case]:
    """Good uses of issue 24's options."""
    c = "controls"
    sim = SIMULATE_FIFO
    jobs = {"jobs.jsonl": '{"submit": 0, "duration": 3600}\n', **GRID_FILE}
    typed = {"gridshift.toml": TYPED}
    right_sized = _toml(
        {**SSH_NODE, **POWER, "share": "time-slice", "share_users": "any", "gpu_idle_w": 40,
         "node_idle_w": 200, "pue": 1.3, "wake": "3m", "wake_timeout": "6m",
         "power_timeout": "1m"}
    )  # fmt: skip
    daemon_cfg = '[daemon]\npue = 1.4\npower_limit = "15kW"\n'
    return [
        Case(c, "--gpu-type fake", ["submit", "--gpu-type", "FAKE", "--", "true"], expect=0),
        Case(c, "--gpu-type '' (any)", ["submit", "--gpu-type", "", "--", "true"], expect=0),
        Case(c, "--gpu-type v100 on a V100 node",
             ["submit", "--gpu-type", "Tesla-V100", "--share", "--", "true"], typed, expect=0),
        Case(c, "--gpus 2-4 --gpu-type v100 (2 V100s)",
             ["submit", "--gpus", "2-4", "--gpu-type", "v100", "--", "true"], typed, expect=0),
        Case(c, "--cron --share --gpu-type fake",
             ["submit", "--cron", "0 2 * * *", "--window", "8h", "--share", "--gpu-type", "fake",
              "--", "true"], expect=0),
        Case(c, "sweep line share, gpu_type",
             ["submit", "--file", "j.jsonl"],
             {"j.jsonl": json.dumps({"command": ["true"], "share": True, "gpu_type": "fake"})
              + "\n" + json.dumps({"command": ["true"], "share": False, "gpu_type": None})},
             expect=0),
        Case(c, "nodes: right-sized, sharing SSH node", ["nodes", "--json"],
             {"gridshift.toml": right_sized + daemon_cfg}, expect=0),
        Case(c, "plan --power-limit 15kW",
             ["plan", "--json", "--grid", "csv:grid.csv", "--at", "2023-01-02T00:00Z",
              "--power-limit", "15 kW"], GRID_FILE,
             expect=0),
        Case(c, "daemon --power-limit 15kW", ["daemon", "--until-idle", "--power-limit", "15kW"],
             expect=0),
        Case(c, "simulate --power-limit 15kW --share 0.5",
             [*sim, "--power-limit", "15kW", "--share", "0.5"], jobs, expect=0),
        Case(c, "simulate --cluster mixed_cluster.toml",
             [*sim, "--cluster", "mixed.toml"], {"mixed.toml": MIXED, **jobs}, expect=0),
        Case(c, "simulate scenario: issue 24's keys",
             ["simulate", "--json", "--policy", "fifo", "s.toml", "--jobs", "jobs.jsonl", "--grid",
              "csv:grid.csv"],
             {"s.toml": '[jobs]\nshare = 0.5\nmodels = "none"\nmoves = "empty-servers"\n'
              '[cluster]\ngpu = "p100"\n'
              'idle_off_after = "30m"\nwake = "5m"\nnode_idle_w = 100\ngpu_idle_w = 30\n'
              'nodes = [{name = "a", gpus = 8, gpu = "a100"}, {name = "b", gpus = 8}]\n',
              **jobs}, expect=0),
    ]  # fmt: skip


CATEGORIES = {
    "cli": cli_cases,
    "file": file_cases,
    "config": config_cases,
    "grid-csv": grid_cases,
    "simulate": sim_cases,
    "timezone": tz_cases,
    "controls": controls,
}


# -- running one case -------------------------------------------------------------------
def run_case(case: Case) -> dict:
    home = Path(tempfile.mkdtemp(prefix="gridshift-bad-"))
    try:
        for rel, content in case.files.items():
            path = home / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, str):  # @HOME@: this case's home, for absolute paths
                content = content.replace("@HOME@", str(home)).encode()
            path.write_bytes(content)
        for rel, mode in case.modes.items():
            (home / rel).chmod(mode)
        for rel, uid in case.owners.items():
            os.chown(home / rel, uid, -1)
        for rel, target in case.links.items():
            (home / rel).symlink_to(home / target)
        env = dict(case.env)
        if "gridshift.toml" not in case.files:  # a config case says its own GPUs
            env.setdefault("GRIDSHIFT_FAKE_GPUS", "4")
        outcome = forkcli.run(case.argv, home, env, timeout_s=TIME_LIMIT_S)
        left = [f"{n} {table} rows" for table, n in forkcli.stored(home).items() if n]
        cache = home / "grid-cache"
        if cache.is_dir() and any(p.is_file() for p in cache.rglob("*")):
            left.append("grid-cache files")
        clean_json = "Infinity" not in outcome.stdout and "NaN" not in outcome.stdout
        if case.expect == 0:
            ok = outcome.code == 0 and clean_json
        else:
            ok = outcome.one_line_error(case.argv[0]) and not left and clean_json
        return {
            "category": case.category,
            "name": case.name,
            "ok": ok,
            "exit": outcome.code,
            "stderr": outcome.stderr.strip()[-300:],
            "stored": left,
            "seconds": round(outcome.seconds, 2),
        }
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--category", choices=sorted(CATEGORIES), action="append")
    parser.add_argument("--verbose", action="store_true", help="every case, not only failures")
    args = parser.parse_args()
    forkcli.warm_up()
    chosen = args.category or list(CATEGORIES)
    results = [run_case(case) for name in chosen for case in CATEGORIES[name]()]
    summary: dict = {"categories": {}, "failures": []}
    for name in chosen:
        mine = [r for r in results if r["category"] == name]
        summary["categories"][name] = {
            "tried": len(mine),
            "one_line_exit_2_nothing_stored" if name != "controls" else "exit_0": sum(
                r["ok"] for r in mine
            ),
        }
    bad = [r for r in results if r["category"] != "controls"]
    summary["total_bad_inputs"] = len(bad)
    summary["total_one_line"] = sum(r["ok"] for r in bad)
    summary["share_one_line"] = round(summary["total_one_line"] / max(1, len(bad)), 4)
    summary["failures"] = [r for r in results if not r["ok"]]
    if args.verbose:
        summary["cases"] = results
    json.dump(summary, sys.stdout, indent=2, ensure_ascii=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
