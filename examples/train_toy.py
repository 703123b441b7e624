"""A stand-in training script for trying gridshift without a GPU framework.

It "trains" for --epochs epochs of --epoch-seconds each, prints progress with the GPUs it
was given, reports progress to gridshift (the two lines below, in any training loop), and
checkpoints to --checkpoint when it receives SIGTERM, then exits 0: gridshift requeues a
job that may be suspended with its progress, and the next run continues where it stopped.

    gridshift submit --gpus 2 --within 12h --duration 10m --interruptible \\
        -- python examples/train_toy.py --epochs 600
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

stop = False


def _on_sigterm(_signum, _frame) -> None:
    global stop
    stop = True


def report(done: int, total: int) -> None:
    """Progress for gridshift: it plans the rest of a suspended job from it."""
    path = os.environ.get("GRIDSHIFT_PROGRESS_FILE")
    if path:
        Path(path).write_text(f"{done} {total}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--epoch-seconds", type=float, default=1.0)
    parser.add_argument("--checkpoint", type=Path, default=Path("toy-checkpoint.json"))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _on_sigterm)
    start = json.loads(args.checkpoint.read_text())["epoch"] if args.checkpoint.exists() else 0
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    print(
        f"job {os.environ.get('GRIDSHIFT_JOB_ID', '?')} on GPUs [{gpus}] from epoch {start}",
        flush=True,
    )
    report(start, args.epochs)
    for epoch in range(start, args.epochs):
        until = time.monotonic() + args.epoch_seconds
        while time.monotonic() < until and not stop:
            time.sleep(min(0.05, max(0.0, until - time.monotonic())))
        if stop:  # the epoch in progress is lost; the finished ones are kept
            args.checkpoint.write_text(json.dumps({"epoch": epoch}))
            print(f"SIGTERM: checkpointed after {epoch} epochs", flush=True)
            sys.exit(0)
        report(epoch + 1, args.epochs)
        print(f"epoch {epoch + 1}/{args.epochs} done", flush=True)
    args.checkpoint.unlink(missing_ok=True)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
