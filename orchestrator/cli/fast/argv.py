"""A strict command-line parser derived from a typer command function's signature.

Each parameter's name, kind and type come from its ``Annotated[T, typer.Option(...)]``
or ``typer.Argument(...)``: the one definition the full typer command line also reads.
``spec_of`` gives None for a function it cannot mirror exactly (an environment variable,
a prompt, a custom parser ...); ``parse`` gives None for any command line it does not
fully understand (``--help``, an unknown or repeated option, ``-xy``, a value it would
have to interpret: ``" 3"``, ``3.0``). The caller then runs the full typer path, which
decides (and says what is wrong). Values it does take convert as typer's would:
``[0-9]+`` to int, a path to ``Path``, an empty list to None where that is the default.
"""

from __future__ import annotations

import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from typer.models import ArgumentInfo, OptionInfo, ParameterInfo

SCALARS = (str, int, Path, bool)
INT = re.compile(r"-?[0-9]+")
# settings that change nothing about parsing or conversion (or are checked below)
NEUTRAL = {
    "default",
    "param_decls",
    "help",
    "metavar",
    "show_default",
    "show_choices",
    "show_envvar",
    "hidden",
    "rich_help_panel",
    "case_sensitive",
    "allow_from_autoenv",
    "is_eager",
    "callback",
    "min",
    "max",
    "dir_okay",
}


@dataclass
class Param:
    name: str  # the Python parameter's name
    kind: type  # str, int, Path or bool
    many: bool  # a list: repeatable option, or nargs=-1 argument
    default: Any
    required: bool
    decls: tuple[str, ...] = ()  # options only
    off: tuple[str, ...] = ()  # a bool option's --no-... names
    eager: bool = False  # an eager flag (--version): acts when given, the full path runs it
    info: ParameterInfo | None = None


@dataclass
class Spec:
    options: dict[str, Param] = field(default_factory=dict)  # by every name: --all, -a
    arguments: list[Param] = field(default_factory=list)
    params: list[Param] = field(default_factory=list)
    context: str | None = None  # the name of the typer.Context parameter
    interspersed: bool = True  # options may follow arguments


def spec_of(fn, context_settings: dict | None = None) -> Spec | None:
    """The parsing rules of a typer command function, or None where it uses anything
    this parser does not mirror. The parameters are read as typer reads them
    (``typer.utils.get_params_from_function``)."""
    import typer
    from typer.utils import get_params_from_function

    settings = dict(context_settings or {})
    interspersed = settings.pop("allow_interspersed_args", True)
    if settings.keys() - {"help_option_names"}:
        return None
    spec = Spec(interspersed=bool(interspersed))
    for name, meta in get_params_from_function(fn).items():
        if meta.annotation is typer.Context:
            spec.context = name
            continue
        param = _param(name, meta.annotation, meta.default)
        if param is None:
            return None
        spec.params.append(param)
        if isinstance(param.info, ArgumentInfo):
            spec.arguments.append(param)
        else:
            for decl in (*param.decls, *param.off):
                spec.options[decl] = param
    if any(p.many for p in spec.arguments[:-1]):
        return None
    return spec


def _param(name: str, hint, info) -> Param | None:
    if not isinstance(info, OptionInfo | ArgumentInfo) or not _plain(info):
        return None
    kind, many = _kind(hint)
    if kind is None or (many and kind is bool):
        return None
    default, required = info.default, info.default is ...
    param = Param(name, kind, many, None if required else default, required, info=info)
    if isinstance(info, ArgumentInfo):
        return None if kind is bool or info.callback or info.is_eager else param
    decls = tuple(info.param_decls or ())
    # only an eager flag, off by default, whose callback gives back what it got: --version
    if info.callback is not None:
        if not (info.is_eager and kind is bool and default is False):
            return None
        param.eager = True
    if any("/" in d or not d.startswith("-") for d in decls):
        return None
    if not decls:
        decls = ("--" + name.replace("_", "-"),)
        if kind is bool:
            param.off = ("--no-" + name.replace("_", "-"),)
    param.decls = decls
    return param


def _plain(info: ParameterInfo) -> bool:
    """Whether every setting of ``info`` is one this parser mirrors."""
    fresh = type(info)()
    return all(
        key in NEUTRAL or value == getattr(fresh, key, None) for key, value in vars(info).items()
    )


def _kind(hint) -> tuple[type | None, bool]:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, _union_type()) and len(args) == 1:
        hint = args[0]
    many = typing.get_origin(hint) is list
    if many:
        (hint,) = typing.get_args(hint) or (None,)
    return (hint if hint in SCALARS else None), many


def _union_type():
    import types

    return types.UnionType


def parse(spec: Spec, args: list[str]) -> dict[str, Any] | None:
    """The keyword arguments the function gets for ``args``, or None (see the module)."""
    given: dict[str, Any] = {}
    positional: list[str] = []
    i, options_done = 0, False
    while i < len(args):
        word = args[i]
        i += 1
        if options_done or word == "-" or not word.startswith("-"):
            positional.append(word)
            if not spec.interspersed:
                options_done = True
            continue
        if word == "--":
            options_done = True
            continue
        name, eq, value = word.partition("=")
        param = spec.options.get(name if word.startswith("--") else word)
        if param is None or param.eager or (param.name in given and not param.many):
            return None
        if param.kind is bool:
            if eq:
                return None
            given[param.name] = name not in param.off
            continue
        if not eq:
            if i >= len(args):
                return None
            value, i = args[i], i + 1
        converted = _convert(param, value)
        if converted is None:
            return None
        if param.many:
            given.setdefault(param.name, []).append(converted)
        else:
            given[param.name] = converted
    if not _place(spec, positional, given):
        return None
    out = {}
    for p in spec.params:
        if p.name in given:
            out[p.name] = given[p.name]
        elif p.required:
            return None
        else:
            out[p.name] = p.default
    return out


def _place(spec: Spec, words: list[str], given: dict[str, Any]) -> bool:
    """The positional words onto the arguments (a list, always the last, takes the rest)."""
    rest = spec.arguments[-1] if spec.arguments and spec.arguments[-1].many else None
    fixed = spec.arguments[:-1] if rest else spec.arguments
    if rest is None and len(words) > len(fixed):
        return False
    for param, word in zip(fixed, words, strict=False):
        given[param.name] = _convert(param, word)
    if rest is not None and words[len(fixed) :]:
        given[rest.name] = [_convert(rest, word) for word in words[len(fixed) :]]
    return all(v is not None for v in given.values() for v in (v if isinstance(v, list) else [v]))


def split(spec: Spec, args: list[str]) -> tuple[list[str], list[str]] | None:
    """``args`` cut where the first word that is not an option of ``spec`` (nor one's
    value) stands: a group's options, then its command and the command's words."""
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] not in ("-", "--"):
        param = spec.options.get(args[i].partition("=")[0])
        if param is None:
            return None
        i += 1 if param.kind is bool or "=" in args[i] else 2
    return (args[:i], args[i:]) if i < len(args) else None


def _convert(param: Param, word: str) -> Any:
    info = param.info
    try:
        word.encode()
    except UnicodeEncodeError:  # bytes that were not UTF-8 in argv: typer decides
        return None
    if param.kind is int:
        if not INT.fullmatch(word):
            return None
        value = int(word)
        low, high = info.min, info.max  # type: ignore[union-attr]
        if (low is not None and value < low) or (high is not None and value > high):
            return None
        return value
    if param.kind is Path:
        if not word or "\0" in word:  # typer says what is wrong with it
            return None
        if info is not None and not info.dir_okay and os.path.isdir(word):
            return None
        return Path(word)
    return word
