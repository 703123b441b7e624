"""Configuration: ``GRIDSHIFT_*`` environment variables over a TOML file
(``$GRIDSHIFT_HOME/gridshift.toml`` or ``--config PATH``) over defaults.

Nested values use ``__`` in environment names (``GRIDSHIFT_GRID__UK__BASE_URL``).
"""

from __future__ import annotations

import tomllib
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from orchestrator.api.environ import env_path, not_blank
from orchestrator.errors import ConfigError, first_invalid
from orchestrator.settings.nodes import (  # noqa: F401 (re-exported)
    MAX_FAKE_GPUS,
    MAX_NODE_GPUS,
    NodeConfig,
    _duration,
    _not_bool,
)

EMPTY_SERVERS, WAITING_JOBS = "empty-servers", "waiting-jobs"  # daemon.moves, besides true
MOVES = (EMPTY_SERVERS, WAITING_JOBS)


def move_kinds(moves: bool | str) -> dict[str, bool]:
    """``daemon.moves`` as the ``Mover``'s flags: which moves it makes."""
    return {"waiting_jobs": moves in (True, WAITING_JOBS),
            "empty_servers": moves in (True, EMPTY_SERVERS)}  # fmt: skip


_BOOL_WORDS = {w: True for w in ("true", "1", "yes", "on")} | {
    w: False for w in ("false", "0", "no", "off")
}
DEFAULT_HOME = Path("~/.local/share/gridshift").expanduser()
CONFIG_NAME = "gridshift.toml"
MAX_CONFIG_BYTES = 1 << 20


class ProviderSettings(BaseModel):
    """One grid provider: ``[grid.electricitymaps]`` or ``GRIDSHIFT_GRID__ELECTRICITYMAPS__*``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    base_url: str | None = Field(default=None, description="for proxies, mirrors, tests")
    api_key: SecretStr | None = None
    username: str | None = None
    password: SecretStr | None = None


class GridSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    source: list[str] = Field(
        default_factory=list, description="default source chain, tried in order"
    )
    cache: bool = True
    timeout_s: float = Field(default=30.0, gt=0, le=600)
    retries: int = Field(default=4, ge=0, le=10)
    uk: ProviderSettings = Field(default_factory=ProviderSettings)
    electricitymaps: ProviderSettings = Field(default_factory=ProviderSettings)
    watttime: ProviderSettings = Field(default_factory=ProviderSettings)
    energy_charts: ProviderSettings = Field(default_factory=ProviderSettings)
    entsoe: ProviderSettings = Field(default_factory=ProviderSettings)
    carbon_aware: ProviderSettings = Field(default_factory=ProviderSettings)


class DaemonSettings(BaseModel):
    """``[daemon]``: what the carbon-aware daemon plans with (each also a daemon option)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    grid: list[str] = Field(default_factory=list, description="carbon signal; default: grid.source")
    price: str | None = Field(default=None, description="price signal, for cost and accounts")
    policy: str | None = Field(default=None, description="default: budget with a grid, else fifo")
    slot: str = Field(default="15m", description="planning slot, 1s to 1h")
    budget: str | None = Field(default=None, description="carbon budget, e.g. 20kg/day")
    default_duration: str = Field(
        default="4h",
        description="the run time planned for a job with no --duration, no progress report "
        "and no earlier run of its name; 1m to 7d",
    )
    checkpoint_cost: str = Field(
        default="5m",
        description="run time a suspension (checkpoint, restart) costs a job without its "
        "own --checkpoint-cost; 0 to 1d",
    )
    moves: bool | str = Field(
        default=False,
        description="co-location moves: a running --share --interruptible job alone may be "
        'checkpointed to join another: "waiting-jobs" (for a job waiting for GPUs), '
        '"empty-servers" (to empty a server right-sizing may power off), true (both); '
        "off by default",
    )
    move_after: str = Field(
        default="10m",
        description="co-location: a running --share job moves next to another no sooner "
        "than this plus twice its checkpoint cost after it started",
    )
    objective: str = "carbon"
    suspend: Literal["signal", "stop"] = "signal"
    refresh: str | None = Field(
        default=None, description="grid refresh timer; default: the slot, at most 15m"
    )
    signal_max_age: str = Field(
        default="6h", description="plan on cached data this long after the source fails"
    )
    fallback: Literal["run-now", "deadline-only"] = "deadline-only"
    backfill: Literal["conservative", "easy", "strict"] = "conservative"  # planning.backfill
    power_caps: bool = True
    pue: float = Field(default=1.0, ge=1.0, le=5.0, description="facility power over IT "
                       "power, for idle energy (a node's pue wins)")  # fmt: skip
    power_sample: str = Field(default="5s", description="energy samples in each power log")
    power_limit: str | None = Field(
        default=None, description="site limit on the sum of the GPUs' power limits, e.g. 15kW"
    )
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_addr: str = Field(
        default="127.0.0.1",
        description="address the metrics listen on; 0.0.0.0 or :: for every interface",
    )
    discovery: str = Field(
        default="1m", description="how often the SSH servers' GPUs are looked at again"
    )
    lease: str = Field(
        default="30s",
        description="PostgreSQL: how long a silent daemon keeps the queue before another "
        "daemon on the same database takes over",
    )

    @field_validator(
        "slot",
        "refresh",
        "signal_max_age",
        "power_sample",
        "discovery",
        "lease",
        "default_duration",
        "checkpoint_cost",  # 0 to 1d (timeparse.parse_checkpoint_s)
        "move_after",
        mode="after",
    )
    @classmethod
    def _durations(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _duration(value, checkpoint=info.field_name == "checkpoint_cost")

    @field_validator("moves", mode="before")
    @classmethod
    def _moves(cls, value: object) -> bool | str:
        word = value.strip().lower() if isinstance(value, str) else None
        if word in _BOOL_WORDS:  # an environment variable's (GRIDSHIFT_DAEMON__MOVES=1)
            return _BOOL_WORDS[word]
        if word in MOVES:  # as the booleans: case and spaces aside ("Empty-Servers")
            return word
        if isinstance(value, bool):
            return value
        raise ValueError(f'moves is true, false, "{EMPTY_SERVERS}" or "{WAITING_JOBS}"')

    @field_validator("pue", mode="before")
    @classmethod
    def _pue(cls, value: object) -> object:
        return _not_bool(value)

    @field_validator("slot", mode="after")
    @classmethod
    def _slot(cls, value: str) -> str:
        from orchestrator.timeparse import parse_duration_s

        if not 1.0 <= parse_duration_s(value) <= 3600.0:
            raise ValueError(f"{value!r}: a planning slot is 1s to 1h")
        return value

    @field_validator("default_duration", mode="after")
    @classmethod
    def _default_duration(cls, value: str) -> str:
        from orchestrator.timeparse import parse_duration_s

        if not 60.0 <= parse_duration_s(value) <= 7 * 86400.0:
            raise ValueError(f"{value!r}: a default run time is 1m to 7d")
        return value

    @field_validator("metrics_addr", mode="after")
    @classmethod
    def _address(cls, value: str) -> str:
        import ipaddress

        if value != "localhost":
            try:
                ipaddress.ip_address(value)
            except ValueError:
                raise ValueError(
                    f"{value!r} is not an IP address (e.g. 127.0.0.1, or 0.0.0.0 for every "
                    "interface)"
                ) from None
        return value

    @field_validator("power_limit", mode="before")
    @classmethod
    def _power_limit(cls, value: object) -> str | None:
        from orchestrator.errors import SpecError
        from orchestrator.timeparse import parse_power_w

        if value is None:
            return None
        try:
            parse_power_w(value)
        except SpecError as exc:
            raise ValueError(str(exc)) from None
        return str(value)

    @property
    def power_limit_w(self) -> float | None:
        from orchestrator.timeparse import parse_power_w

        return None if self.power_limit is None else parse_power_w(self.power_limit)

    @field_validator("budget", mode="after")
    @classmethod
    def _budget(cls, value: str | None) -> str | None:
        if value is not None:
            from orchestrator.planning.budgets import Budget

            try:
                Budget.parse(value)
            except Exception as exc:
                raise ValueError(str(exc)) from None
        return value

    def seconds(self, name: str) -> float | None:
        from orchestrator.timeparse import parse_checkpoint_s, parse_duration_s

        value = getattr(self, name)
        if value is None:
            return None
        return parse_checkpoint_s(value) if name == "checkpoint_cost" else parse_duration_s(value)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GRIDSHIFT_", env_nested_delimiter="__", extra="forbid", allow_inf_nan=False
    )

    home: Annotated[Path, BeforeValidator(not_blank)] = DEFAULT_HOME
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default SQLite (WAL) under home"
    )
    fake_gpus: int | None = Field(
        default=None, ge=0, le=MAX_FAKE_GPUS, description="pretend GPUs, local node"
    )
    fake_gpu_power_w: float | None = Field(
        default=None,
        gt=0,
        le=10_000,
        description="constant draw of each fake GPU, for energy accounting",
    )
    nodes: list[NodeConfig] = Field(default_factory=list)
    shared_group: str | None = Field(
        default=None,
        description="Unix group whose members use this queue through the daemon's socket",
    )
    socket: Annotated[Path | None, BeforeValidator(not_blank)] = Field(
        default=None, description="the daemon's Unix socket; default: home/gridshift.sock"
    )
    cancel_grace_s: float = Field(default=10.0, ge=0, le=86400, description="SIGTERM to SIGKILL")
    daemon_interval_s: float = Field(default=1.0, ge=0.05, le=3600, description="between passes")
    daemon: DaemonSettings = Field(default_factory=DaemonSettings)
    grid: GridSettings = Field(default_factory=GridSettings)

    @field_validator("home", mode="after")
    @classmethod
    def _expand_home(cls, value: Path) -> Path:
        return value.expanduser().absolute()

    @field_validator("nodes", mode="after")
    @classmethod
    def _unique_names(cls, nodes: list[NodeConfig]) -> list[NodeConfig]:
        names = [n.name for n in nodes]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"node names must be unique; repeated: {', '.join(dupes)}")
        return nodes

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        return (init_settings, env_settings, _FileSource(settings_cls, _FILE_DATA.get() or {}))

    # -- derived paths ----------------------------------------------------------------
    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'gridshift.db'}"

    @property
    def socket_path(self) -> Path:
        return (self.socket or self.home / "gridshift.sock").expanduser().absolute()

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def runs_dir(self) -> Path:
        return self.home / "run"

    @property
    def grid_cache_dir(self) -> Path:
        return self.home / "grid-cache"

    def log_path(self, job_id: int) -> Path:
        return self.logs_dir / f"{job_id}.log"


_FILE_DATA: ContextVar[dict[str, Any] | None] = ContextVar("gridshift_file", default=None)


class _FileSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field, field_name):  # required by the base class
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


def _read_toml(path: Path) -> dict[str, Any]:
    """The file's tables; any problem (not there, too large, not UTF-8, not TOML, nested
    too deeply) is one ConfigError."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path}: larger than {MAX_CONFIG_BYTES >> 20} MiB")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path}: not UTF-8 (byte {exc.start + 1})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config file {path}: nested too deeply") from None


def load_settings(config: Path | None = None) -> Settings:
    """Settings from the environment, the config file and defaults.

    The file is ``config`` when given (it must exist), else ``$GRIDSHIFT_HOME/gridshift.toml``
    when that exists."""
    if config is None:
        home = Path(env_path("GRIDSHIFT_HOME") or DEFAULT_HOME).expanduser()
        candidate = home / CONFIG_NAME
        data = _read_toml(candidate) if candidate.is_file() else {}
        source = candidate
    else:
        data, source = _read_toml(config), config
    token = _FILE_DATA.set(data)
    try:
        settings = Settings()
        if any(n.power_off or n.power_on for n in settings.nodes) and source.is_file():
            from orchestrator.settings.trust import untrusted

            if (why := untrusted(source)) is not None:  # it names what root runs
                raise ConfigError(f"{source} names power commands but {why}")
        return settings
    except ValidationError as exc:
        loc, msg = first_invalid(exc)
        where = ".".join(str(p) for p in loc) or "settings"
        raise ConfigError(
            f"invalid setting {where} (from {source} or GRIDSHIFT_* environment): {msg}"
        ) from None
    except SettingsError as exc:  # a GRIDSHIFT_* variable that is not the JSON it must be
        raise ConfigError(f"invalid GRIDSHIFT_* environment: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise ConfigError("invalid GRIDSHIFT_* environment: JSON nested too deeply") from None
    finally:
        _FILE_DATA.reset(token)
