"""Elastic jobs in what-if runs: which traced jobs may be resized, and how they scale.

``--elastic FRACTION`` lets that share of the jobs (drawn with the scenario's seed) run on
anything from half to double their traced GPU count. How a job speeds up with GPUs comes
from the ElasticFlow A100 throughput tables (``perf/elasticflow-a100/MODEL.csv`` in the
shared data: iterations per second by global batch size and GPU count) when the trace
names its model (the Tiresias trace does: ``resnet50``, ``vgg19``, ...): a model maps to
the table of its family, read at its largest batch size. Other jobs scale by the model's
default (90 % efficiency per doubling).
"""

from __future__ import annotations

import csv
from functools import cache
from pathlib import Path

import numpy as np

# model-name prefix -> ElasticFlow table (the closest family that was measured)
FAMILIES = (
    ("resnet50_cifar", "resnet50_cifar10"),
    ("resnet", "resnet50"),
    ("vgg", "vgg16"),
    ("alexnet", "vgg16"),
    ("inception", "inception3"),
    ("googlenet", "inception3"),
    ("bert", "bert"),
    ("gpt", "gpt2"),
    ("deepspeech", "deepspeech2"),
)


def table_name(model_name: str) -> str | None:
    name = model_name.strip().lower()
    return next((table for prefix, table in FAMILIES if name.startswith(prefix)), None)


@cache
def read_table(path: Path) -> dict[int, float] | None:
    """GPU count -> iterations/s at the table's largest global batch size."""
    try:
        with open(path, newline="") as fh:
            rows = list(csv.reader(fh))
    except OSError:
        return None
    header, body = rows[0], [r for r in rows[1:] if r]
    if not body:
        return None
    row = max(body, key=lambda r: float(r[0]))
    return {int(n): float(v) for n, v in zip(header[1:], row[1:], strict=True) if v}


def scaling_tables(names: tuple[str, ...] | None, folder: Path | None) -> list:
    """Per job, its throughput table or None."""
    if names is None or folder is None:
        return [None] * (len(names) if names else 0)
    out = []
    for name in names:
        table = table_name(name)
        out.append(read_table(folder / f"{table}.csv") if table else None)
    return out


def elastic_ranges(gpus: np.ndarray, fraction: float, seed: int, total: int):
    """(min, max) GPU counts: half to double the traced count for the drawn share."""
    rng = np.random.default_rng([seed, 2])
    chosen = rng.uniform(0, 1, len(gpus)) < fraction
    lo = np.where(chosen, np.maximum(1, gpus // 2), gpus)
    hi = np.where(chosen, np.minimum(gpus * 2, total), gpus)
    return lo.astype(np.int64), np.maximum(hi, gpus).astype(np.int64)
