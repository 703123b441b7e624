"""A what-if scenario: a TOML file (``examples/whatif.toml``), with every option also a
flag of ``gridshift simulate``. Validated with pydantic; one clear error for bad input.

    name = "lab, last quarter"
    policies = ["fifo", "lowest-window", "lowest-slots", "budget"]
    forecast = "perfect"              # perfect | naive | noise:0.1
    objective = "carbon"              # carbon | cost | mix:0.5 (with a price signal)
    budget = "40kg/day"               # optional: kg per day, week or month, or a total
    power_limit_w = "20kW"            # optional: the site's limit, jobs and idle (W, kW, MW)
    slot = "15m"                      # the planners' slot
    backfill = "conservative"         # conservative | easy | strict (no backfill)
    seed = 0
    timezone = "Europe/Berlin"        # deadline rules read clock times here

    [jobs]
    source = "synthetic:count=400&days=14"   # or a trace path (Philly, Tiresias, specs)
    max_jobs = 0                      # the first N jobs in arrival order (0: all)
    skip_jobs = 0                     # ... after leaving out this many
    deadline_rule = "within:24h"      # none | within:D | next-workday | semi-weekly
    interruptible = 0.3               # share of jobs that may be suspended
    checkpoint_cost = "5m"            # run time a suspension costs each of those (0 to 1d)
    elastic = 0.2                     # share that may run on half to double their GPUs
    models = "gavel"                  # model families of unnamed jobs: gavel (drawn) | none
    share = 0.5                       # share that may run two to a GPU (sim/hardware/colocation.py)
    pair_speeds = "model"             # a pair runs at: model | measured (Gavel's) | PATH.json
    moves = false                     # checkpoint a job alone to join another: true |
                                      # "empty-servers" | "waiting-jobs" (true: both)

    [grid]
    source = "synthetic:mean=300&days=21"    # any grid source spec, e.g. csv:PATH
    price = "csv:prices.csv"          # optional
    start = "2023-01-01"              # only for web sources: the range to fetch
    end = "2023-04-01"

    [cluster]
    gpus = 64                         # or nodes = [{name, gpus, rack}, ...]
    gpus_per_node = 8
    nodes_per_rack = 16
    gpu = "v100"                      # the GPU type (v100, p100, a40, rtx6000, a100, k80);
                                      # [[nodes]] may each say their own: gpu = "p100"
    host_w_per_gpu = 50.0
    pue = 1.0
    node_idle_w = 150.0               # a server on, besides its GPUs (sim.hardware.power)
    gpu_idle_w = 60.0                 # an idle GPU (default: 20 % of its maximum limit)
    idle_off_after = "30m"            # right-sizing: a node idle this long is powered off
    wake = "5m"                       # ... and answers this long after it is woken
    plan_idle = false                 # planners count the idle time a wait adds (right-sized)

Paths are relative to the scenario file and may use environment variables
(``$GRIDSHIFT_SHARED_DATA``).
"""

from __future__ import annotations

import os
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from orchestrator.errors import ConfigError, SpecError, first_invalid
from orchestrator.queue.spec import read_text_file
from orchestrator.settings import EMPTY_SERVERS, MOVES, WAITING_JOBS  # the daemon's moves
from orchestrator.settings.nodes import MAX_GPU_IDLE_W


def check_duration(value: str | None, never: bool = True) -> str | None:
    """A duration such as "30m", or "never" where ``never`` allows it (idle_off_after:
    never powered off; a wake-up cannot take forever)."""
    from orchestrator.timeparse import parse_duration_s

    if value is None or (never and value == "never"):
        return value
    try:
        parse_duration_s(value)
    except SpecError as exc:
        raise ValueError(str(exc)) from None
    return value


def no_bool(value: object) -> object:
    """A number given as true or false is a mistake (pydantic alone reads true as 1)."""
    if isinstance(value, bool):
        raise ValueError(f"a number, not {str(value).lower()}")
    return value


class SimNode(BaseModel):
    # a gridshift.toml's [[nodes]] table works: its daemon keys are left aside, any other
    # key is refused (a typo such as idle_of_after would leave right-sizing off unseen)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1)
    gpus: int | None = Field(default=None, ge=1, le=65_536)  # a node of 0: no cluster
    fake_gpus: int | None = Field(default=None, ge=1, le=65_536)
    rack: str | None = None
    nvlink_islands: list[list[int]] | None = None
    gpu: str | None = Field(default=None, min_length=1, max_length=64)  # default: cluster.gpu
    gpu_model: str | None = Field(default=None, max_length=255)  # a gridshift.toml's name

    @model_validator(mode="before")
    @classmethod
    def _daemon_keys(cls, value: object) -> object:
        """A daemon's node keys (executor, host, power_on ...) mean nothing here."""
        from orchestrator.settings.nodes import NodeConfig

        if isinstance(value, dict):
            daemon_only = NodeConfig.model_fields.keys() - cls.model_fields.keys()
            value = {k: v for k, v in value.items() if k not in daemon_only}
        return value

    @model_validator(mode="after")
    def _gpu_type(self) -> SimNode:
        self.gpu = self.gpu or self.gpu_model or None  # a gridshift.toml says gpu_model
        if self.gpu is not None:
            _named(self.gpu)
        return self

    # idle power and right-sizing (sim.hardware.power); None: the cluster's
    idle_off_after: str | None = None
    wake: str | None = None
    node_idle_w: float | None = Field(default=None, ge=0, le=100_000)
    gpu_idle_w: float | None = Field(default=None, ge=0, le=MAX_GPU_IDLE_W)

    @field_validator("idle_off_after", "wake")
    @classmethod
    def _durations(cls, value: str | None, info: ValidationInfo) -> str | None:
        return check_duration(value, never=info.field_name == "idle_off_after")

    _numbers = field_validator("node_idle_w", "gpu_idle_w", mode="before")(no_bool)

    @property
    def gpu_count(self) -> int:
        count = self.gpus if self.gpus is not None else self.fake_gpus
        if count is None:
            raise ConfigError(f"cluster node {self.name}: give its number of gpus")
        return count


class ClusterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    gpus: int = Field(default=64, ge=1, le=1_000_000)
    gpus_per_node: int = Field(default=8, ge=1, le=64)
    nodes_per_rack: int = Field(default=16, ge=1)
    nodes: list[SimNode] | None = None
    gpu: str = Field(default="v100", min_length=1, max_length=64)  # nodes' default type
    host_w_per_gpu: float = Field(default=50.0, ge=0)
    pue: float = Field(default=1.0, ge=1.0, le=5.0)  # as the daemon's (settings)
    # idle power and right-sizing (sim.hardware.power): a node idle for idle_off_after is powered
    # off ("never"/None: never), and answers again wake after it is woken
    idle_off_after: str | None = None
    wake: str = "5m"
    node_idle_w: float = Field(default=150.0, ge=0, le=100_000)  # a server on, no GPU
    gpu_idle_w: float | None = Field(default=None, ge=0, le=MAX_GPU_IDLE_W)  # None: 20 % of max
    # planners count the idle server time a waiting job adds (with right-sizing only;
    # always on, a deferral adds none)
    plan_idle: bool = False

    @field_validator("idle_off_after", "wake")
    @classmethod
    def _durations(cls, value: str | None, info: ValidationInfo) -> str | None:
        return check_duration(value, never=info.field_name == "idle_off_after")

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, value: str) -> str:
        return _named(value)

    @field_validator("nodes")
    @classmethod
    def _some_nodes(cls, value: list[SimNode] | None) -> list[SimNode] | None:
        if value is not None and not value:  # was the default cluster (64 GPUs), unsaid
            raise PydanticCustomError(
                "no_nodes", "give at least one node, or leave nodes out and give gpus"
            )
        return value

    _numbers = field_validator("host_w_per_gpu", "pue", "node_idle_w", "gpu_idle_w", mode="before")(
        no_bool
    )


def _named(gpu: str) -> str:
    """A GPU type that names one (``"!!!"`` or ``"   "`` names none: refused)."""
    from orchestrator.planning.devices.typenames import type_of

    if type_of(gpu) is None:
        raise ValueError(f"GPU type {gpu!r} names no GPU (a name such as v100 or a100)")
    return gpu


class JobsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    source: str = "synthetic"
    max_jobs: int = Field(default=0, ge=0)
    skip_jobs: int = Field(default=0, ge=0)  # leave out the first N in arrival order
    deadline_rule: str = "within:24h"
    interruptible: float = Field(default=0.0, ge=0.0, le=1.0)
    checkpoint_cost: str = "5m"  # run time a suspension costs an interruptible job
    elastic: float = Field(default=0.0, ge=0.0, le=1.0)  # share that may run on ½-2× GPUs
    scaling: str | None = None  # folder of ElasticFlow tables (default: the shared data's)
    # gavel: unnamed jobs' model families drawn from Gavel's mix (sim.devices); none
    models: Literal["gavel", "none"] = "gavel"
    share: float = Field(default=0.0, ge=0.0, le=1.0)  # share that may run two to a GPU
    # what a pair runs at: the model's prediction, or Gavel's measured speeds (a path to
    # its throughputs JSON, or "measured": the shared data's); the model decides either way
    pair_speeds: str = "model"
    # co-location moves (sim.hardware.colocation), off by default; true: both kinds
    moves: bool | str = False

    _shares = field_validator("interruptible", "elastic", "share", mode="before")(no_bool)

    @field_validator("moves", mode="before")
    @classmethod
    def _moves(cls, value: object) -> bool | str:
        word = value.strip().lower() if isinstance(value, str) else None
        if isinstance(value, bool) or word in MOVES:  # the daemon's words, case aside
            return value if isinstance(value, bool) else word
        raise ValueError(f'moves is true, false, "{EMPTY_SERVERS}" or "{WAITING_JOBS}"')

    @field_validator("pair_speeds")
    @classmethod
    def _pair_speeds(cls, value: str) -> str:
        if not value.strip():  # read as the scenario's own folder, "Is a directory"
            raise ValueError('pair_speeds is "model", "measured" or a path to Gavel\'s '
                             "throughputs JSON")  # fmt: skip
        return value

    @field_validator("checkpoint_cost")
    @classmethod
    def _checkpoint_cost(cls, value: str) -> str:
        from orchestrator.timeparse import parse_checkpoint_s

        try:
            parse_checkpoint_s(value)
        except SpecError as exc:
            raise ValueError(str(exc)) from None
        return value


class GridConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    source: str = "synthetic"
    price: str | None = None
    start: datetime | None = None
    end: datetime | None = None

    @model_validator(mode="after")
    def _range(self) -> GridConfig:
        def utc(value: datetime) -> datetime:
            return value if value.tzinfo else value.replace(tzinfo=UTC)

        if self.start and self.end and utc(self.start) >= utc(self.end):
            raise ValueError("grid.start must be before grid.end")
        return self


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = "what-if"
    policies: list[str] = Field(default_factory=lambda: ["fifo", "lowest-window"])
    forecast: str = "perfect"
    seed: int = Field(default=0, ge=0, le=2**64 - 1)
    timezone: str = "UTC"
    max_defer: str = "24h"
    objective: str = "carbon"  # carbon | cost | mix:W
    budget: str | None = None  # e.g. 20kg/day, 150kg/week, 500kg (the whole run)
    # the site's limit on the jobs' draw: watts, or as people type it ("15kW")
    power_limit_w: float | None = Field(default=None, gt=0)
    slot: str = "15m"  # the planners' slot
    backfill: str = "conservative"  # conservative | easy | strict (planning.backfill)
    # optimal's wall-clock limit per replan (oracle: 10× this). None: a node limit instead,
    # so the answer does not depend on the machine's speed (runner.NODE_LIMIT)
    time_limit: str | None = None
    jobs: JobsConfig = Field(default_factory=JobsConfig)
    grid: GridConfig = Field(default_factory=GridConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    _flags: dict = PrivateAttr(default_factory=dict)  # key path -> the flag that set it

    def named(self, *path: str) -> str:
        """How an error found after validation names the key at ``path``: the flag that
        gave it (``--power-limit``), else ``invalid`` and the key (``power_limit_w``)."""
        return self._flags.get(path) or f"invalid {'.'.join(path)}"

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        from orchestrator.timeparse import zone_info

        try:
            zone_info(value)
        except SpecError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("power_limit_w", mode="before")
    @classmethod
    def _power_limit(cls, value: object) -> float | None:
        from orchestrator.timeparse import parse_power_w

        if value is None:
            return None
        try:
            return parse_power_w(value)
        except SpecError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("backfill")
    @classmethod
    def _backfill(cls, value: str) -> str:
        from orchestrator.planning.backfill import check_backfill

        try:
            return check_backfill(value)
        except SpecError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("policies")
    @classmethod
    def _some(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("name at least one policy")
        return [v.strip().lower() for v in value]


def load_scenario(path: Path | None) -> tuple[Scenario, Path]:
    """The scenario in ``path`` (None: all defaults) and the folder its paths are
    relative to."""
    if path is None:
        return Scenario(), Path.cwd()
    if not Path(path).exists():
        raise SpecError(f"no such scenario file: {path}")
    text = read_text_file(Path(path), "scenario", limit=1 << 20)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"scenario {path}: invalid TOML ({exc})") from None
    except RecursionError:
        raise SpecError(f"scenario {path}: invalid TOML (nested too deeply)") from None
    base = Path(path).resolve().parent
    scenario = validate(raw, str(path))
    scenario.jobs.source = resolve_path(scenario.jobs.source, base)
    scenario.grid.source = resolve_path(scenario.grid.source, base)
    if scenario.grid.price:
        scenario.grid.price = resolve_path(scenario.grid.price, base)
    return scenario, base


def validate(raw: dict, where: str, flags: dict[tuple, str] | None = None) -> Scenario:
    """``raw`` as a scenario; a problem is one line naming the key in ``where`` (the
    scenario file), or the flag that gave it (``flags``: key path -> flag)."""
    try:
        scenario = Scenario.model_validate(raw)
    except ValidationError as exc:
        loc, msg = first_invalid(exc)
        flag = next((f for path, f in (flags or {}).items() if loc[: len(path)] == path), None)
        if flag is not None:
            raise SpecError(f"{flag}: {msg}") from None
        field = ".".join(str(p) for p in loc) or "scenario"
        raise SpecError(f"{where}: {field}: {msg}") from None
    scenario._flags = dict(flags or {})  # errors found later name the flag too (``named``)
    return scenario


def load_cluster_file(path: Path) -> ClusterConfig:
    """``--cluster FILE``: a TOML with a ``[cluster]`` table and/or ``[[nodes]]`` tables
    (a gridshift.toml describes its cluster this way)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise SpecError(f"no such cluster file: {path}")
    try:
        raw = tomllib.loads(read_text_file(path, "cluster file", limit=1 << 20))
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"cluster file {path}: {exc}") from None
    except RecursionError:
        raise SpecError(f"cluster file {path}: nested too deeply") from None
    if not isinstance(raw.get("cluster", {}), dict):
        raise SpecError(f"cluster file {path}: [cluster] must be a table")
    from orchestrator.settings import Settings  # a gridshift.toml's other keys are left aside

    unknown = sorted(raw.keys() - Settings.model_fields.keys() - {"cluster"})
    if unknown:
        raise SpecError(
            f"cluster file {path}: {unknown[0]}: not a key of a cluster file "
            "([cluster], [[nodes]] or a gridshift.toml's)"
        )
    table = dict(raw.get("cluster", {}))
    if "nodes" in raw:
        table["nodes"] = raw["nodes"]
    if not table:
        raise SpecError(f"cluster file {path}: no [cluster] or [[nodes]] tables")
    try:
        return ClusterConfig.model_validate(table)
    except ValidationError as exc:
        loc, msg = first_invalid(exc)
        raise SpecError(f"cluster file {path}: {'.'.join(str(p) for p in loc)}: {msg}") from None


def resolve_path(text: str, base: Path) -> str:
    """A trace path or ``csv:PATH`` spec with variables expanded, relative to ``base``."""
    expanded = os.path.expandvars(os.path.expanduser(text))
    if expanded.startswith("csv:"):
        inner = expanded[4:]
        path, sep, query = inner.partition("?")
        full = Path(path) if Path(path).is_absolute() else base / path
        return f"csv:{full}{sep}{query}"
    if ":" in expanded.split("/")[0] or expanded == "synthetic":
        return expanded  # a source spec such as uk, synthetic:..., electricitymaps:DE
    return str(Path(expanded) if Path(expanded).is_absolute() else base / expanded)
