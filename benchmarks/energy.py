"""Energy levers of issue 24 against the simulator's baselines. Prints JSON.

- ``colocation_energy_saving`` / ``colocation_jct_increase`` (``benchmarks/energy_colocation.py``)
- ``idle_energy_saved`` (``benchmarks/energy_idle.py``)
- ``peak_over_limit`` (``benchmarks/energy_limit.py``)

Each part is also run alone: ``--only colocation|idle|limit``.

    python benchmarks/energy.py [--only PART] [--jobs N]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

PARTS = ("colocation", "idle", "limit")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=PARTS)
    parser.add_argument("--jobs", type=int, default=None, help="jobs per run (each part's default)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parent))
    out: dict = {}
    for part in [args.only] if args.only else PARTS:
        try:
            module = importlib.import_module(f"energy_{part}")
        except ModuleNotFoundError:
            continue  # not built yet
        out.update(module.measure(jobs=args.jobs))
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
