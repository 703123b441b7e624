"""The ``gridshift`` command and its one error boundary: every gridshift error becomes one
line on stderr and exit code 2 (user mistake) or 1 (failure), never a traceback."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli import context
from orchestrator.cli.accounts import budget, report, status
from orchestrator.cli.cancel import cancel, clean
from orchestrator.cli.cron_cmd import cron_app
from orchestrator.cli.daemon_cmd import daemon, db_app
from orchestrator.cli.grid_cmd import grid_app
from orchestrator.cli.listing import ls, show
from orchestrator.cli.logs import logs
from orchestrator.cli.nodes import nodes
from orchestrator.cli.plan import plan
from orchestrator.cli.simulate import simulate
from orchestrator.cli.submit import HELP as SUBMIT_HELP
from orchestrator.cli.submit import submit
from orchestrator.cli.verbs.change import edit, hold, release, restart
from orchestrator.cli.verbs.wait import wait

app = typer.Typer(
    name="gridshift",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help as written: rich markup would eat "[daemon]", "[[nodes]]"
    context_settings={"help_option_names": ["-h", "--help"]},
    help="gridshift: a carbon-aware GPU job queue for deep-learning training.",
)


def _print_version(value: bool) -> bool:
    if value:
        from orchestrator import __version__

        typer.echo(f"gridshift {__version__}")
        raise typer.Exit()
    return value  # what the root callback gets (and the fast path gives it)


@app.callback()
def _root(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="Config file (default: $GRIDSHIFT_HOME/gridshift.toml).",
            dir_okay=False,
        ),
    ] = None,
    utc: Annotated[
        bool,
        typer.Option(
            "--utc",
            help="Print every time in UTC (default: the local zone; also GRIDSHIFT_UTC=1).",
        ),
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print gridshift's version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    from orchestrator.timeparse import show_utc

    if utc:
        show_utc(True)
    context.get(ctx).config_path = config


app.command(help=SUBMIT_HELP, context_settings={"allow_interspersed_args": False})(submit)
app.command()(ls)
app.command()(show)
app.command()(cancel)
app.command()(clean)
app.command()(logs)
app.command()(wait)
app.command()(restart)
app.command()(hold)
app.command()(release)
app.command()(edit)
app.command()(nodes)
app.command()(daemon)
app.command()(simulate)
app.command()(plan)
app.command()(status)
app.command()(budget)
app.command()(report)
app.add_typer(grid_app, name="grid")
app.add_typer(cron_app, name="cron")
app.add_typer(db_app, name="db")


def _fail(message: str, code: int) -> None:
    from orchestrator.signals.redact import printable, redact

    # errors quote URLs and users' values: no secret, no control character gets through
    sys.stderr.write(f"gridshift: error: {printable(redact(message))}\n")
    sys.exit(code)


def _refuse_words_before_separator(args: list[str]) -> None:
    """``submit``'s options, then ``--``, then the command: a word before a later ``--``
    is a mistake (``--share yes -- true`` would queue ``yes -- true``), refused."""
    from orchestrator.cli.fast.run import words_before_separator
    from orchestrator.errors import SpecError

    try:
        stray = words_before_separator(app, args)
    except Exception:  # it only parses: typer answers instead
        stray = None
    if stray:
        words = " ".join(repr(w) for w in stray[:3]) + (" ..." if len(stray) > 3 else "")
        raise SpecError(
            f"{words} before -- would become the command: give submit's options, then --, "
            "then the command (gridshift submit [OPTIONS] -- COMMAND)"
        )


def main(argv: list[str] | None = None) -> None:
    """The ``gridshift`` command: the everyday verbs through the fast path when it
    understands the command line (``orchestrator.cli.fast``), else the full typer one."""
    import logging

    from orchestrator.errors import GridshiftError, boundary

    # Outside the daemon (which sets up logging), what these say already reaches the
    # user as the command's one error line or its output: no stray warnings on stderr.
    for name in ("orchestrator", "executors", "grid"):
        logging.getLogger(name).addHandler(logging.NullHandler())
    for name in ("httpx", "httpcore"):  # their INFO lines carry full URLs, tokens and all
        logging.getLogger(name).setLevel(logging.WARNING)
    args = sys.argv[1:] if argv is None else list(argv)
    run = None
    from orchestrator.api.environ import env_flag

    if not env_flag("GRIDSHIFT_NO_FAST"):  # 1, true, yes or on; 0 keeps the fast path
        from orchestrator.cli.fast.run import plan

        try:
            run = plan(app, args)
        except Exception:  # it only parses: the full path answers instead
            run = None
    try:
        with boundary():
            _refuse_words_before_separator(args)
            result = run() if run is not None else _full(args)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        _fail("interrupted", 130)
    except typer.TyperException as exc:  # usage errors: unknown option, bad value ...
        ctx = getattr(exc, "ctx", None)
        hint = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
        _fail(exc.format_message() + hint, exc.exit_code)
    except BrokenPipeError:
        sys.stderr.close()  # output piped into head: not an error
        sys.exit(0)
    except GridshiftError as exc:
        _fail(str(exc), exc.exit_code)
    sys.exit(result if isinstance(result, int) else 0)


def _full(args: list[str]):
    command = typer.main.get_command(app)
    _tidy_help(command)
    return command.main(args=args, prog_name="gridshift", standalone_mode=False)


def _tidy_help(command) -> None:
    """Help as a terminal shows it: the docstrings' ``literal`` quoting (reStructuredText)
    shown as the bare word."""
    for item in (command, *getattr(command, "params", ())):
        for attr in ("help", "short_help"):
            if isinstance(text := getattr(item, attr, None), str):
                setattr(item, attr, text.replace("``", ""))
    for sub in getattr(command, "commands", {}).values():
        _tidy_help(sub)
