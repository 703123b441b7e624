"""1,000,000 mixed allocate/free operations on a 1,024-GPU cluster (128 nodes × 8 GPUs,
16 racks), with Philly-like request sizes (mostly 1 GPU, some 2, 4, 8 and 16). Prints
JSON: ops, ops_per_s, peak_mem_mb, fragmentation_mean (free GPUs that cannot serve an
8-GPU request, sampled every 1,000 operations), and how many requests had to wait.

    python benchmarks/placement.py [--ops 1000000] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from placement.cluster import ClusterAllocator
from placement.topology import ClusterTopology, NodeTopology

SIZES = [1] * 84 + [2] * 6 + [4] * 5 + [8] * 4 + [16] * 1  # Philly's mix, roughly


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    nodes = tuple(NodeTopology.plain(f"n{i:03d}", 8, rack=f"r{i // 8:02d}") for i in range(128))
    alloc = ClusterAllocator(ClusterTopology(nodes))
    # pre-draw the workload so the timed loop measures the allocator, not the RNG
    sizes = [rng.choice(SIZES) for _ in range(args.ops)]
    coins = [rng.random() for _ in range(args.ops)]
    live: list[int] = []
    waited = 0
    frag_samples, busy_samples = [], []
    start = time.perf_counter()
    for n in range(args.ops):
        # hover around 85 % busy: allocate below it, free a random job above it
        if live and alloc.free_gpus < 154 and coins[n] < 0.9:
            i = int(coins[n] * len(live) / 0.9)
            live[i], live[-1] = live[-1], live[i]
            alloc.free(live.pop())
        elif alloc.allocate(n, sizes[n]) is not None:
            live.append(n)
        else:
            waited += 1
        if n % 1000 == 0:
            frag_samples.append(alloc.fragmentation(8))
            busy_samples.append(1 - alloc.free_gpus / 1024)
    elapsed = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "ops": args.ops,
                "seconds": round(elapsed, 3),
                "ops_per_s": round(args.ops / elapsed),
                "peak_mem_mb": round(peak_kb / 1024, 1),
                "fragmentation_mean": round(sum(frag_samples) / len(frag_samples), 1),
                "busy_mean": round(sum(busy_samples) / len(busy_samples), 3),
                "requests_waited": waited,
                "cluster": "128 nodes x 8 GPUs, 16 racks",
                "python": sys.version.split()[0],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
