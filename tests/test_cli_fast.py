"""The CLI's fast path (orchestrator/cli/fast): for the everyday verbs it gives what the
full typer command line gives, byte for byte, against a daemon and without one; it loads
none of pydantic, SQLAlchemy or rich against a daemon (the test that keeps it fast,
without timing anything); ``--version``, ``-h`` and help text that reads as written."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from orchestrator.cli import app as cli_app
from orchestrator.cli.fast.run import resolve
from tests.conftest import E2E, ROOT, Cli, base_env, cleanup
from tests.helpers.waiting import wait_for

# -- the parser: what it takes, it parses as typer does ------------------------------
TAKEN = [
    ["ls"],
    ["ls", "-a"],
    ["ls", "--all", "--json"],
    ["--config", "/tmp/x.toml", "ls"],
    ["--config=/tmp/x.toml", "show", "3"],
    ["show", "007"],
    ["show", "3", "--json"],
    ["status"],
    ["status", "--json"],
    ["cancel", "1", "2", "3"],
    ["logs", "4"],
    ["logs", "-f", "4"],
    ["logs", "4", "--follow"],
    ["submit", "--", "python", "train.py", "--lr", "3e-4"],
    ["submit", "python", "-c", "pass", "--json"],  # after the command: the command's
    ["submit", "--gpus", "2-4", "--name=a b", "--priority", "-3", "--", "true"],
    ["submit", "--after", "3,4", "--after", "5", "--label", "x", "--env", "A=1", "true"],
    ["submit", "--workdir", "/tmp", "--now", "--interruptible", "--json", "--", "-"],
    ["submit", "--file", "jobs.jsonl"],
    ["submit", "--cron", "0 2 * * *", "--window", "8h", "--", "sh", "-c", "x"],
    ["submit", "--name", "--gpus", "--", "true"],  # a value that looks like an option
    ["submit", "--name", "--", "true"],
    ["submit", "--name", "", "--env=", "--", ""],
    ["submit"],
    ["ls", "--state", "queued", "--state", "running", "--user", "ann", "--label=x"],
    ["logs", "-n", "20", "4"],
    ["wait", "3", "4", "--timeout", "30m", "-q"],
    ["restart", "3"],
    ["hold", "3", "4"],
    ["release", "3"],
    ["edit", "3", "--priority", "-2", "--gpus", "2-4", "--within=12h", "--json"],
]
FALLS_BACK = [
    [],
    ["--help"],
    ["-h"],
    ["--version"],
    ["ls", "-h"],
    ["ls", "--help"],
    ["ls", "-aa"],
    ["ls", "--json=1"],
    ["ls", "--bogus"],
    ["ls", "extra"],
    ["show"],
    ["show", " 3"],
    ["show", "3.0"],
    ["show", "1_0"],
    ["show", "x"],
    ["show", "\udcff"],
    ["show", "3", "4"],
    ["show", "--json", "-12"],  # an option to click: "no such option: -1"
    ["cancel"],
    ["cancel", "1", "two"],
    ["logs", "4", "-n"],
    ["submit", "--priority", "1.5", "true"],
    ["submit", "--priority"],
    ["submit", "--name", "a", "--name", "b", "true"],
    ["submit", "--workdir", "", "true"],
    ["submit", "--workdir", "/tmp\x00x", "--", "true"],  # a NUL: typer's "null byte"
    ["--config", "/tmp", "ls"],  # dir_okay=False: typer's error
    ["--bogus", "ls"],
    ["nodes"],
    ["grid", "sources"],
    ["daemon", "--until-idle"],
]


@pytest.fixture
def recorded(monkeypatch):
    """The keyword arguments typer's full path gives the root callback and the command."""
    seen: dict = {}

    def recorder(fn, key):
        @functools.wraps(fn)
        def record(*args, **kwargs):
            kwargs.pop("ctx", None)
            seen[key] = (fn.__name__, kwargs)

        return record

    app = cli_app.app
    monkeypatch.setattr(app.registered_callback, "callback", recorder(cli_app._root, "root"))
    for info in app.registered_commands:
        monkeypatch.setattr(info, "callback", recorder(info.callback, "command"))
    command = typer.main.get_command(app)

    def full(args: list[str]) -> dict:
        seen.clear()
        command.main(args=list(args), prog_name="gridshift", standalone_mode=False)
        return dict(seen)

    return full


@pytest.mark.parametrize("args", TAKEN, ids=" ".join)
def test_what_the_fast_parser_takes_it_parses_as_typer(args, recorded):
    call = resolve(cli_app.app, args)
    assert call is not None, "the fast path should take this command line"
    full = recorded(args)
    assert full["root"] == ("_root", call.root_kwargs)
    assert full["command"] == (call.command.callback.__name__, call.kwargs)
    for name, value in call.kwargs.items():  # the same types too: 7 and not "007"
        assert type(value) is type(full["command"][1][name]), name


@pytest.mark.parametrize("args", FALLS_BACK, ids=lambda a: " ".join(a) or "nothing")
def test_what_it_does_not_fully_understand_goes_to_typer(args):
    assert resolve(cli_app.app, args) is None


# -- end to end: byte-identical output and exit codes --------------------------------
def _gridshift(cli: Cli, args: list[str], fast: bool) -> tuple[int, str, str]:
    env = dict(cli.env)
    if not fast:
        env["GRIDSHIFT_NO_FAST"] = "1"
    p = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        env=env,
        cwd=cli.home,
        capture_output=True,
        timeout=60,
    )
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def _same(cli: Cli, args: list[str], mask: str | None = None) -> None:
    fast, full = _gridshift(cli, args, True), _gridshift(cli, args, False)
    if mask:  # what changes between the two runs (a new job's id, a clock)
        fast, full = (tuple(re.sub(mask, "#", str(x)) for x in r) for r in (fast, full))
    assert fast == full, f"gridshift {' '.join(args)}"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A queue with one finished job (it printed "hello") and a daemon serving it."""
    home = tmp_path_factory.mktemp("fast") / "home"
    home.mkdir()
    cli = Cli(home, base_env(home))
    cli.submit("--now", "--", "sh", "-c", "echo hello")
    cli.daemon("--interval", "0.2")
    wait_for((home / "gridshift.sock").exists, 60, "the daemon's socket")
    cli.wait_state(1, {"completed"})
    yield cli
    cleanup(cli)


SERVED = [
    ["ls"],
    ["ls", "-a", "--json"],
    ["ls", "--bogus"],
    ["show", "1", "--json"],
    ["show", "1"],
    ["show", "x"],
    ["show", "99"],
    ["show", "-h"],
    ["cancel", "99", "1"],
    ["cancel"],
    ["logs", "1"],
    ["logs", "-f", "1"],
    ["logs", "99"],
    ["submit", "--gpus", "x", "--", "true"],
    ["submit", "--priority", "1.5", "--", "true"],
    ["--config", "/nonexistent.toml", "ls"],
    ["--utc", "show", "1"],
    ["ls", "--state", "nonsense"],
    ["logs", "-n", "1", "1"],
    ["hold", "99"],
    ["edit", "1", "--priority", "3"],
    ["wait", "1"],
]


@E2E
def test_against_a_daemon_the_fast_path_prints_what_typer_prints(served):
    for args in SERVED:
        _same(served, args)
    _same(served, ["submit", "--duration", "1h", "--", "true"], mask=r"\b\d+\b")
    _same(served, ["status"], mask=r"\d+(\.\d+)?")  # its last pass, its power move on


@pytest.mark.backends("sqlite")
def test_without_a_daemon_the_fast_path_prints_what_typer_prints(cli):
    cli.submit("--", "true")
    for args in (["ls", "-a"], ["show", "1", "--json"], ["status"], ["cancel", "1", "7"]):
        _same(cli, args)


# -- what keeps it fast ---------------------------------------------------------------
HEAVY = ("pydantic", "sqlalchemy", "sqlmodel", "rich")
PROBE = (
    "import atexit, sys\n"
    "atexit.register(lambda: sys.stderr.write('LOADED ' + ' '.join(sorted({m.split('.')[0] "
    "for m in sys.modules})) + '\\n'))\n"
    "from orchestrator.cli.app import main\n"
    "main(sys.argv[1:])\n"
)


def _loaded(cli: Cli, *args: str) -> set[str]:
    p = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env=cli.env,
        cwd=cli.home,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return set(p.stderr.rsplit("LOADED ", 1)[1].split())


@E2E
@pytest.mark.parametrize(
    "args",
    [
        ["ls"],
        ["ls", "--json"],
        ["show", "1"],
        ["show", "1", "--json"],
        ["logs", "1"],
        ["cancel", "99"],
        ["submit", "--json", "--", "true"],
    ],
    ids=" ".join,
)
def test_against_a_daemon_the_verbs_load_no_heavy_library(served, args):
    assert not _loaded(served, *args) & set(HEAVY)


@E2E
def test_against_a_daemon_status_loads_no_database_layer(served):
    # its text is still rich markup (about 0.02 s): pydantic and SQLAlchemy are the point
    assert not _loaded(served, "status") & {"pydantic", "sqlalchemy", "sqlmodel"}


# -- --version, -h, help text -----------------------------------------------------------
def _run(*args: str) -> tuple[int, str]:
    env = {k: v for k, v in base_env(Path("/nonexistent")).items()}
    p = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    return p.returncode, p.stdout + p.stderr


def test_version_prints_the_package_version():
    from orchestrator import __version__

    assert _run("--version") == (0, f"gridshift {__version__}\n")


@pytest.mark.parametrize("words", [[], ["show"], ["grid"], ["grid", "show"]], ids=" ".join)
def test_dash_h_is_help(words, capsys):
    codes = []
    for flag in ("-h", "--help"):
        with pytest.raises(SystemExit) as exc:
            cli_app.main([*words, flag])
        codes.append(exc.value.code)
    short, long = capsys.readouterr().out.split("Usage: ")[1:]
    assert codes == [0, 0] and short == long and "-h, --help" in short


def _help(*words: str, capsys) -> str:
    with pytest.raises(SystemExit):
        cli_app.main([*words, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_help_reads_as_written(capsys):
    assert "config file's [daemon] table" in _help("daemon", capsys=capsys)
    assert "([cluster] and/or [[nodes]])" in _help("simulate", capsys=capsys)
    assert "(--refresh: asked now)" in _help("nodes", capsys=capsys)
    for info in cli_app.app.registered_commands:
        text = _help(info.name or info.callback.__name__, capsys=capsys)
        assert "<bool>" not in text and "``" not in text, info.callback.__name__


def test_submit_gpus_help_says_what_the_planner_does(capsys):
    text = _help("submit", capsys=capsys)
    assert "with a grid signal the planner picks the width" in text
    assert "--after ID" in text and "--env KEY=VALUE" in text and "--label LABEL" in text
    assert "runs at the maximum for now" not in text
