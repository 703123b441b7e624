"""A stand-in ``nvidia-smi`` for test servers: answers ``--query-gpu=... --format=csv,
noheader,nounits [-i N,M]`` and ``-i N -pl W`` the way the real one does, for GPUs whose
power limits persist in a state file (``executors.gpu.fake``), and records every ``-pl``
call in ``<state>.calls``.

    fake_nvidia_smi.py --state FILE --count N [--power W] [--deny-pl] [--no-energy] ARGS...
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from executors.errors import GpuControlError
from executors.gpu.fake import FakeGpuControl


def _options(argv: list[str]) -> tuple[dict, list[str]]:
    opts = {"power": 250.0, "deny_pl": False, "energy": True}
    rest = []
    it = iter(argv)
    for arg in it:
        if arg == "--state":
            opts["state"] = next(it)
        elif arg == "--count":
            opts["count"] = int(next(it))
        elif arg == "--power":
            opts["power"] = float(next(it))
        elif arg == "--deny-pl":
            opts["deny_pl"] = True
        elif arg == "--no-energy":
            opts["energy"] = False
        else:
            rest.append(arg)
    return opts, rest


def _field(ctl: FakeGpuControl, i: int, name: str, opts: dict) -> str:
    limit = ctl.power_limit_w(i)
    values = {
        "index": str(i),
        "uuid": f"GPU-{Path(opts['state']).stem}-{i:04d}",
        "name": "NVIDIA A100-SXM4-80GB",
        "memory.total": "81920",
        "memory.used": "0",
        "utilization.gpu": "0",
        "power.draw": f"{min(opts['power'], limit):.2f}",
        "power.limit": f"{limit:.2f}",
        "power.default_limit": f"{ctl.default_power_limit_w(i):.2f}",
        "power.min_limit": f"{ctl.power_limit_range_w(i)[0]:.2f}",
        "power.max_limit": f"{ctl.power_limit_range_w(i)[1]:.2f}",
        "total_energy_consumption": (
            str(round(ctl.energy_j(i) * 1000)) if opts["energy"] else "[Not Supported]"
        ),
    }
    if name not in values:
        print(f'Field "{name}" is not a valid field to query.', file=sys.stderr)
        sys.exit(2)
    return values[name]


def main(argv: list[str]) -> int:
    opts, args = _options(argv)
    ctl = FakeGpuControl(opts["count"], power_w=opts["power"], state_path=opts["state"])
    indices = list(range(opts["count"]))
    if "-i" in args:
        indices = [int(x) for x in args[args.index("-i") + 1].split(",")]
    if "-pl" in args:
        watts = float(args[args.index("-pl") + 1])
        with open(f"{opts['state']}.calls", "a") as fh:
            fh.write(f"pl {','.join(map(str, indices))} {watts:.2f}\n")
        if opts["deny_pl"]:
            print("Insufficient Permissions", file=sys.stderr)
            return 4
        for i in indices:
            old = ctl.power_limit_w(i)
            try:
                ctl.set_power_limit_w(i, watts)
            except GpuControlError as exc:
                print(f"Provided power limit {watts:.2f} W is not valid: {exc}", file=sys.stderr)
                return 2
            print(f"Power limit for GPU 00000000:{i:02X}:00.0 was set to {watts:.2f} W "
                  f"from {old:.2f} W.")  # fmt: skip
        return 0
    if any(a.startswith("--query-compute-apps=") for a in args):
        return 0  # no compute process runs on a fake GPU
    query = next((a for a in args if a.startswith("--query-gpu=")), None)
    if query is None or "--format=csv,noheader,nounits" not in args:
        print(
            "fake nvidia-smi: only --query-gpu with csv,noheader,nounits and -pl", file=sys.stderr
        )
        return 2
    fields = query.split("=", 1)[1].split(",")
    for i in indices:
        print(", ".join(_field(ctl, i, f, opts) for f in fields))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
