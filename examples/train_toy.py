"""A stand-in training script for trying gridshift without a GPU framework.

It "trains" for --epochs epochs of --epoch-seconds each, prints progress with the GPUs it
was given, and checkpoints to --checkpoint when it receives SIGTERM (then exits 0), so a
resubmitted or resumed run continues where it stopped.

    gridshift submit --gpus 2 --interruptible -- python examples/train_toy.py --epochs 5
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
    for epoch in range(start, args.epochs):
        time.sleep(args.epoch_seconds)
        if stop:
            args.checkpoint.write_text(json.dumps({"epoch": epoch}))
            print(f"SIGTERM: checkpointed at epoch {epoch}", flush=True)
            sys.exit(0)
        print(f"epoch {epoch + 1}/{args.epochs} done", flush=True)
    args.checkpoint.unlink(missing_ok=True)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
