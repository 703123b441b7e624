"""``GRIDSHIFT_*`` variables read as the settings read them (pydantic-settings: names
case-insensitive, an empty value a value), with the standard library alone, so the thin
client and the full loader always name the same home and socket."""

from __future__ import annotations

import os

from orchestrator.errors import ConfigError

TRUE_WORDS = ("1", "true", "yes", "on")


def env_value(name: str) -> str | None:
    """The variable ``name`` in any case (``gridshift_home`` is ``GRIDSHIFT_HOME``); where
    several spellings are set, the one pydantic-settings takes (the last in the
    environment's order). None when unset; ``""`` when set but empty."""
    wanted, found = name.lower(), None
    for key, value in os.environ.items():
        if key.lower() == wanted:
            found = value
    return found


def env_path(name: str) -> str | None:
    """``env_value`` of a path such as ``GRIDSHIFT_HOME``; set but empty (``Path("")``
    would be the working directory, silently) is one ConfigError."""
    value = env_value(name)
    if value is not None and not value.strip():
        raise ConfigError(f"{name} is set but empty: give a directory, or unset it")
    return value


def not_blank(value: object) -> object:
    """A path setting's value, refused when set but empty (``Path("")``: the working
    directory, silently)."""
    if isinstance(value, str) and not value.strip():
        raise ValueError("set but empty: give a path, or leave the setting out")
    return value


def env_flag(name: str) -> bool:
    """A switch such as ``GRIDSHIFT_UTC``: on for 1, true, yes or on (any case)."""
    return (os.environ.get(name) or "").strip().lower() in TRUE_WORDS
