"""Output that survives pipes and 80 columns (``cli/output/tables.py``): piped, ``ls``,
``simulate`` and ``grid sources`` print every value their ``--json`` holds, whatever
``COLUMNS`` says; on a narrow terminal the least useful columns go first and only free
text is cut, never a number or an id."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from orchestrator.cli.output.tables import Col, render
from tests.conftest import ROOT

pytestmark = pytest.mark.backends("sqlite")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SIM = ("simulate", str(ROOT / "examples" / "whatif.toml"), "--jobs",
       "synthetic:count=40&days=2", "--policy", "fifo,budget", "--budget", "1kg/day")  # fmt: skip


def _run(cli, *args: str, terminal: bool = False) -> str:
    env = {**cli.env, "COLUMNS": "80", "GRIDSHIFT_TERMINAL": "1" if terminal else "0"}
    proc = subprocess.run([sys.executable, "-m", "orchestrator", *args], env=env, cwd=cli.home,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return proc.stdout


def _shown(text: str) -> list[str]:
    return [ANSI.sub("", line) for line in text.splitlines()]


def test_plain_tables_are_whole_and_a_terminal_drops_columns_in_order(monkeypatch):
    cols = [Col("ID", right=True), Col("NAME", drop=1), Col("WHEN", drop=2), Col("N", right=True),
            Col("TEXT", free=True)]  # fmt: skip
    rows = [["123456", "a-name", "2026-03-02 09:00:00", "3.14159", "x" * 120]]
    plain = render(cols, rows, tty=False)
    assert "x" * 120 in plain and "…" not in plain and "\x1b" not in plain
    narrow = _shown(render(cols, rows, tty=True, room=60))
    assert narrow[0].split() == ["ID", "NAME", "N", "TEXT"]  # WHEN first
    assert narrow[1].startswith("123456  a-name  3.14159  xxx") and narrow[1].endswith("…")
    assert max(len(line) for line in narrow[:2]) <= 60
    tiny = _shown(render(cols, rows, tty=True, room=20))
    assert tiny[0].split() == ["ID", "N", "TEXT"] and "123456" in tiny[1] and "3.14159" in tiny[1]
    assert "\x1b[1m" in render(cols, rows, tty=True, room=60)
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b" not in render(cols, rows, tty=True, room=60)


def test_tables_measure_terminal_cells_not_characters():
    """Wide (CJK) characters take two cells and combining marks none: piped rows line up
    and a terminal row fits its width; zero-width characters are written out."""
    import unicodedata

    def cells(text: str) -> int:  # what a terminal gives each character
        return sum(0 if unicodedata.combining(c) else
                   2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)  # fmt: skip

    cols = [Col("NAME"), Col("N", right=True), Col("TEXT", free=True)]
    rows = [["数据集", "1", "a"], ["plain", "22", "b"], ["e\u0301te\u0301", "333", "c"]]
    lines = render(cols, rows, tty=False).splitlines()
    starts = {cells(line[: line.index(t)]) for line, t in zip(lines[1:], "abc", strict=True)}
    assert len(starts) == 1, lines  # the TEXT column starts at one cell in every row
    wide = [["1", "数" * 60]]
    for room in (40, 41):
        cut = _shown(render([Col("ID"), Col("TEXT", free=True)], wide, tty=True, room=room))
        assert max(cells(line) for line in cut) <= room and cut[1].endswith("…"), cut
    assert "\\u200bzero" in render([Col("CMD")], [["\u200bzero"]], tty=False)


def test_cell_widths():
    from orchestrator.cli.output.tables import cells

    assert cells("数据") == 4 and cells("ＡＢ") == 4 and cells("e\u0301") == 1
    assert cells("plain") == 5 and cells("ünï → x") == 7


def test_ls_piped_at_80_columns_holds_every_value_of_its_json(cli, tmp_path):
    long = ["python", "train.py", "--data", "/data/imagenet/train", "--epochs", "100", "--lr",
            "0.001", "--name", "a very long experiment name"]  # fmt: skip
    cli.run("submit", "--name", "train-resnet50", "--gpus", "2-4", "--", *long)
    cli.run("submit", "--name", "eval", "--after", "1", "--", "python", "eval.py")
    listed = cli.json("ls")
    lines = _run(cli, "ls").splitlines()
    assert "\x1b" not in "".join(lines) and "…" not in "".join(lines)
    for job, line in zip(listed, lines[1:], strict=True):
        for value in (str(job["id"]), job["name"], job["state"], job["user"],
                      shlex.join(job["command"])):  # fmt: skip
            assert value in line, (value, line)
    assert "2-4" in lines[1] and "after job 1" in lines[2]
    # on an 80-column terminal: SUBMITTED goes first; ids and GPUS stay; the command is cut
    shown = _shown(_run(cli, "ls", terminal=True))
    head = shown[0].split()
    assert [c for c in head if c in ("ID", "STATE", "GPUS", "PLAN")] == ["ID", "STATE", "GPUS",
                                                                        "PLAN"]  # fmt: skip
    assert "SUBMITTED" not in head and "left out at this width: SUBMITTED" in shown[-1]
    assert all(len(line) <= 80 for line in shown[:3]) and shown[1].endswith("…")
    assert "2-4" in shown[1] and "after job 1" in shown[2]


def test_simulate_piped_at_80_columns_holds_every_value_of_its_json(cli):
    from orchestrator.cli.output.simtext import METRICS, OPTIONAL, change

    data = cli.json(*SIM)
    text = _run(cli, *SIM)
    assert "…" not in text and "\x1b" not in text
    lines = text.splitlines()
    for name, m in data["policies"].items():
        row = next(line for line in lines if line.startswith(name + " "))
        cells = row.split()
        for key, _col, fmt in METRICS:
            if key in m or key not in OPTIONAL:  # a limit's, co-location's: only with them
                assert fmt(m[key]) in cells, (key, m[key], row)
        if name != "fifo":
            assert change(m["carbon_kg"], data["policies"]["fifo"]["carbon_kg"]) in cells
        for forced in m["budget"]["forced_jobs"]:  # every one, not the first 8
            assert f"job {forced['job']} at " in text
    s = data["scenario"]
    for key in ("name", "job_source", "grid", "price", "deadline_rule", "forecast", "budget",
                "objective", "timezone"):  # fmt: skip
        assert str(s[key]) in text, key
    for key in ("jobs", "gpus", "seed", "interruptible", "elastic", "skip_jobs"):
        assert f" {s[key]}" in text, key
    # on an 80-column terminal the least useful metrics go; no number is cut
    shown = _shown(_run(cli, *SIM, terminal=True))
    head = next(line for line in shown if line.startswith("policy"))
    assert head.split()[:5] == ["policy", "carbon", "kg", "vs", "fifo"] and "p95" not in head
    assert len(head) <= 80 and "…" not in "\n".join(shown)


def test_grid_sources_piped_holds_every_value_and_a_terminal_cuts_only_descriptions(cli):
    sources = cli.json("grid", "sources")
    text = _run(cli, "grid", "sources")
    lines = text.splitlines()
    widths = {line.index(s["description"]) for s, line in zip(sources, lines[1:], strict=True)}
    assert len(widths) == 1, "descriptions start in one column"
    for s, line in zip(sources, lines[1:], strict=True):
        for value in (s["name"], s["description"], s["base_url"] or "-", *s["needs"]):
            assert value in line, (value, line)
    shown = _shown(_run(cli, "grid", "sources", terminal=True))
    assert all(len(line) <= 80 for line in shown[:-1])
    assert [line.split()[0] for line in shown[1:-1]] == [s["name"] for s in sources]
    assert any(line.endswith("…") for line in shown)


def test_show_prints_only_fields_with_a_value_rounded(cli):
    cli.run("submit", "--name", "s", "--", "true")
    cli.run_until_idle()
    text = _run(cli, "show", "1")
    data = json.loads(_run(cli, "show", "1", "--json"))
    assert not re.search(r"\s-$", text, re.MULTILINE) and "None" not in text
    assert re.search(r"energy\s+\d+(\.\d+)? (k?Wh)", text), text
    for number in re.findall(r"\d+\.\d+", text):  # three significant digits
        assert len(number.replace(".", "").lstrip("0")) <= 3, number
    assert not re.search(r":\d\d\.\d{6}", text), "times to the second"
    assert data["energy_kwh"] > 0 and "gpu_ids" in data and "deadline" in data  # every key


def test_show_says_share_and_a_checkpoint_cost_of_zero(cli):
    """What ``--json`` has, the text shows: ``share`` and a zero checkpoint cost (both
    were left out: QA)."""
    cli.run("submit", "--share", "--interruptible", "--checkpoint-cost", "0s", "--", "true")
    cli.run("submit", "--", "true")
    text = _run(cli, "show", "1")
    assert re.search(r"^  share\s+yes", text, re.MULTILINE), text
    assert re.search(r"^  checkpoint\s+0s$", text, re.MULTILINE), text
    plain = _run(cli, "show", "2")
    assert not re.search(r"^  (share|checkpoint) ", plain, re.MULTILINE), plain


def test_cron_nodes_budget_and_report_piped_at_80_columns_are_whole(cli, tmp_path):
    long = ["python", "nightly.py", "--data", "/data/a/very/long/path/to/the/nightly/shard"]
    cli.run("submit", "--cron", "0 2 * * *", "--window", "8h", "--", *long)
    crons = _run(cli, "cron", "ls")
    assert " ".join(long) in crons and "…" not in crons
    nodes = json.loads(_run(cli, "nodes", "--json"))
    text = _run(cli, "nodes")
    for value in (nodes[0]["name"], nodes[0]["executor"], str(nodes[0]["gpus"]), "fake"):
        assert value in text.splitlines()[1]
    report = _run(cli, "report")
    assert "AT SUBMISSION kg" in report and "…" not in report
    budget = _run(cli, "budget", "--budget", "1kg/day").splitlines()
    assert "spent" in budget[0] and "period from" in budget[0]  # one line, not wrapped at 80


def test_simulate_with_sharing_and_a_limit_names_every_column_and_says_the_scenario(cli):
    """Co-location's and the site limit's metrics get columns named as people read them
    (no JSON key, no True/False), the row holds each value, and the scenario says how
    jobs share; without sharing there is no co-location column and no key."""
    args = (*SIM[:4], "--policy", "fifo", "--share", "1", "--power-limit", "3kW")
    data = cli.json(*args)
    m, s = data["policies"]["fifo"], data["scenario"]
    assert (s["share"], s["pair_speeds"], s["moves"]) == (1.0, "model", False)
    assert {"pairs", "colocation_moves", "splits", "limit_exceeded"} <= set(m)
    assert m["pairs"] > 0, "synthetic jobs that all may share: some pairs form"
    lines = _run(cli, *args).splitlines()
    head = next(line for line in lines if line.startswith("policy")).split()
    assert not [h for h in head if "_" in h], head
    for name in ("pairs", "moves", "splits", "over", "limit", "idle", "power-offs", "wakes"):
        assert name in head, name
    row = next(line for line in lines if line.startswith("fifo ")).split()
    assert "True" not in row and "False" not in row
    assert ("yes" if m["limit_exceeded"] else "no") in row and str(m["pairs"]) in row
    assert "share 1.0 (two to a GPU; pair speeds: model, no moves)" in lines
    plain = cli.json(*SIM[:4], "--policy", "fifo")
    assert plain["scenario"]["share"] == 0.0 and "pairs" not in plain["policies"]["fifo"]
    head = next(ln for ln in _run(cli, *SIM[:4], "--policy", "fifo").splitlines()
                if ln.startswith("policy")).split()  # fmt: skip
    assert "pairs" not in head and "over" not in head
