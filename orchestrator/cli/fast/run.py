"""The everyday verbs without the full typer command line: ``plan`` parses a command line
with the root callback's and the command's own signatures (``argv``) and gives a function
that runs them as typer would, or None for the full path."""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from orchestrator.cli.fast.argv import Spec, parse, spec_of, split

VERBS = frozenset(
    {"submit", "ls", "show", "status", "cancel", "logs", "wait", "restart", "hold", "release"}
    | {"edit"}
)


class Ctx:
    """What the command functions ask of ``typer.Context``: the root's ``obj``."""

    def __init__(self) -> None:
        self.obj = None

    def find_root(self) -> Ctx:
        return self


@dataclass
class Call:
    """One command line as the fast path understood it."""

    root: Any  # typer's CommandInfo of the root callback, or None
    root_spec: Spec
    root_kwargs: dict[str, Any]
    command: Any  # typer's CommandInfo
    spec: Spec
    kwargs: dict[str, Any]


def resolve(app, args: list[str]) -> Call | None:
    """``args`` parsed, or None where the full typer path must run them (anything but
    one of ``VERBS`` with a command line ``parse`` takes)."""
    import os

    if os.environ.get("_GRIDSHIFT_COMPLETE"):  # shell completion: typer's business
        return None
    found = _verb(app, args, VERBS)
    if found is None:
        return None
    root, root_spec, root_args, info, spec, rest = found
    root_kwargs = parse(root_spec, root_args)
    kwargs = None if spec is None else parse(spec, rest)
    if root_kwargs is None or spec is None or kwargs is None:
        return None
    return Call(root, root_spec, root_kwargs, info, spec, kwargs)


def plan(app, args: list[str]) -> Callable[[], int] | None:
    """A function that runs ``args`` as the full path would and gives the exit code, or
    None (see ``resolve``)."""
    call = resolve(app, args)
    if call is None:
        return None
    ctx = Ctx()

    def invoke(fn, spec: Spec, kwargs: dict):
        return fn(**({spec.context: ctx} if spec.context else {}), **kwargs)

    def both():
        if call.root is not None:
            invoke(call.root.callback, call.root_spec, call.root_kwargs)
        return invoke(call.command.callback, call.spec, call.kwargs)

    return lambda: _as_click(both)


def _name(info) -> str:
    return info.name or info.callback.__name__.replace("_", "-")


def _as_click(command: Callable[[], object]) -> int:
    """Run ``command`` as typer's ``Command.main(standalone_mode=False)`` does: an exit
    code for ``typer.Exit`` and Ctrl-C (130), ``typer.Abort`` after EOF, exit 1 when
    stdout is a closed pipe."""
    import typer
    from typer._click.utils import PacifyFlushWrapper

    try:
        try:
            result = command()
        except EOFError as exc:
            typer.echo(file=sys.stderr)
            raise typer.Abort() from exc
        except KeyboardInterrupt as exc:
            raise typer.Exit(130) from exc
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            sys.stdout = PacifyFlushWrapper(sys.stdout)
            sys.stderr = PacifyFlushWrapper(sys.stderr)
            sys.exit(1)
    except typer.Exit as exc:
        return exc.exit_code
    return result if isinstance(result, int) else 0


def words_before_separator(app, args: list[str]) -> list[str] | None:
    """For ``submit``: the words that stand between its options and a later ``--`` (in
    ``gridshift submit --share yes -- true``, ``["yes"]``: taken as the command, they
    would run ``yes -- true``), or None where the command starts at ``--``, has no
    ``--``, or the line is not one this parser reads (typer then decides)."""
    found = _verb(app, args, {"submit"})
    if found is None or found[4] is None or (inner := split(found[4], found[5])) is None:
        return None
    command = inner[1]
    if not command or command[0] == "--" or "--" not in command:
        return None
    return command[: command.index("--")]


def _verb(app, args: list[str], verbs: Collection[str]) -> tuple | None:
    """(root callback, its spec, its words, the command's info, its spec or None, its
    words) where ``args`` name one of ``verbs`` after the root's options, else None."""
    root = app.registered_callback
    root_spec = spec_of(root.callback, root.context_settings) if root else Spec()
    if root_spec is None or (cut := split(root_spec, args)) is None:
        return None
    root_args, (verb, *rest) = cut
    info = next((c for c in app.registered_commands if _name(c) == verb), None)
    if verb not in verbs or info is None:
        return None
    settings = {**(app.info.context_settings or {}), **(info.context_settings or {})}
    return root, root_spec, root_args, info, spec_of(info.callback, settings), rest
