"""A stand-in training script for trying gridshift without a GPU framework.

It "trains" for --epochs epochs of --epoch-seconds each, prints progress with the GPUs it
was given, reports progress to gridshift (the two lines below, in any training loop), and
checkpoints to --checkpoint when it receives SIGTERM, then exits 0: gridshift requeues a
job that may be suspended with its progress, and the next run continues where it stopped.

The checkpoint is the job's own: by default it lives under ``~/.cache/gridshift-toy/``,
named by the job's key (``GRIDSHIFT_JOB_KEY``: its id and submission time, since an id
comes back after ``gridshift clean``) and its queue (the folder of its run directories),
so a resumed attempt of the same job finds it and any other job, in this queue or a new
one, starts from epoch 0. It is removed when training finishes.

    gridshift submit --gpus 2 --within 12h --duration 10m --interruptible \\
        -- python examples/train_toy.py --epochs 600

It learns its width as a real elastic job would: from ``GRIDSHIFT_GPUS`` (the GPUs of
this attempt; else it counts ``CUDA_VISIBLE_DEVICES``). With ``--gpu-seconds S`` an epoch
is S GPU-seconds of work, so it runs faster on more GPUs: an elastic job (``--gpus 2-8
--interruptible``) that gridshift grows or shrinks checkpoints, and resumes from its
checkpoint on its new width.
"""

from __future__ import annotations

import argparse
import hashlib
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


def default_checkpoint() -> Path:
    """This job's checkpoint: one per job and queue, kept across its attempts (each
    attempt has a run directory of its own; their common folder names the queue)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gridshift-toy"
    progress = os.environ.get("GRIDSHIFT_PROGRESS_FILE")
    job = os.environ.get("GRIDSHIFT_JOB_KEY")
    if not (progress and job):  # run by hand: one checkpoint per working directory
        key = hashlib.sha256(str(Path.cwd()).encode()).hexdigest()[:12]
        return cache / f"by-hand-{key}.json"
    queue = hashlib.sha256(str(Path(progress).resolve().parent.parent).encode()).hexdigest()
    name = "".join(c for c in job if c.isalnum() or c == "-")[:64]
    return cache / f"{queue[:12]}-job{name}.json"


def width() -> int:
    """The GPUs this attempt runs on."""
    given = os.environ.get("GRIDSHIFT_GPUS", "")
    if given.isdigit():
        return int(given)
    return len([g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--epoch-seconds", type=float, default=1.0)
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: per job")
    parser.add_argument(
        "--gpu-seconds", type=float, default=None, help="an epoch's work; its time: this / GPUs"
    )
    args = parser.parse_args()
    gpus_n = width()
    if args.gpu_seconds is not None:
        args.epoch_seconds = args.gpu_seconds / max(1, gpus_n)
    args.checkpoint = args.checkpoint or default_checkpoint()
    signal.signal(signal.SIGTERM, _on_sigterm)
    start = json.loads(args.checkpoint.read_text())["epoch"] if args.checkpoint.exists() else 0
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    print(
        f"job {os.environ.get('GRIDSHIFT_JOB_ID', '?')} on {gpus_n} GPUs [{gpus}] "
        f"from epoch {start}",
        flush=True,
    )
    report(start, args.epochs)
    for epoch in range(start, args.epochs):
        until = time.monotonic() + args.epoch_seconds
        while time.monotonic() < until and not stop:
            time.sleep(min(0.05, max(0.0, until - time.monotonic())))
        if stop:  # the epoch in progress is lost; the finished ones are kept
            args.checkpoint.parent.mkdir(parents=True, exist_ok=True)
            args.checkpoint.write_text(json.dumps({"epoch": epoch}))
            print(f"SIGTERM: checkpointed after {epoch} epochs", flush=True)
            sys.exit(0)
        report(epoch + 1, args.epochs)
        print(f"epoch {epoch + 1}/{args.epochs} done", flush=True)
    args.checkpoint.unlink(missing_ok=True)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
