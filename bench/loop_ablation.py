"""Where ``baton run``'s per-epoch time goes: the spiral job with one piece taken out at a time.

Each variant is a real ``baton run`` of examples/spiral.yaml (no mid-epoch checkpoints, 1 torch
thread) in a process of its own, with one part replaced by a no-op before the CLI starts:

- ``no-tensorboard``: the TensorBoard tracker (its thread and SummaryWriter's);
- ``no-job-log``: the attempt's log capture (the stdout tee and its threads);
- ``per-sample``: a TensorDataset's batches loaded sample by sample and collated, as before
  baton gathered them (``data.TensorBatches``);
- ``no-checkpoint``: the checkpoint after each validation (the loop still reads its pending
  losses there; the writer process still starts, and idles).

Two bare loops frame them: ``bare`` (bench/loop_overhead.py's, a DataLoader over a Subset) and
``bare-gathered``, whose batches are gathered by indexing the tensors as baton's are, so that
baton against it is the loop's own overhead, the data path left out.

These are ablations for finding costs, not ways to run a job. The figure is the steady state of
bench/loop_overhead.py: the median time between consecutive "epoch N" lines after the first 20
epochs, for every variant and the bare loop, interleaved (the order reversed every repeat).

    python bench/loop_ablation.py [--epochs 120] [--repeats 4] [--threads 1]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.loop_overhead import bare_command, run_timed, steady_epoch, write_result  # noqa: E402

VARIANTS = ("bare", "bare-gathered", "baton", "per-sample", "no-tensorboard", "no-job-log", "no-checkpoint")
BARE = ("bare", "bare-gathered")


def _remove(variant: str) -> None:
    """Patch one piece out of this process's baton (called before the CLI runs)."""
    from baton.workers.attempt import local, session
    from baton.workers.training import data, loop

    if variant == "no-tensorboard":
        class NoTracker:
            def __init__(self, *args, **kwargs): pass
            def resumed_from(self, step): pass
            def row(self, row): pass
            def committed(self, step): pass
            def close(self, *args): pass
        session.TensorBoardTracker = NoTracker
    elif variant == "no-job-log":
        run_attempt = session.run_attempt
        local.run_attempt = lambda attempt, options: run_attempt(attempt, dataclasses.replace(options, job_log=False))
    elif variant == "per-sample":
        data.SplitView.tensor_batches = lambda self: None
    elif variant == "no-checkpoint":
        loop.TrainingLoop._checkpoint = lambda self, *args, **kwargs: self._absorb_readings()


def run_variant(variant: str, epochs: int, store: Path, threads: int) -> None:
    """The variant's ``baton run`` in this process."""
    if variant != "baton":
        _remove(variant)
    from baton.cli import main

    sys.argv = ["baton", "run", str(ROOT / "examples" / "spiral.yaml"), "--id", "ablation", "--storage",
                f"file://{store}", "--no-progress", "--set", f"loop.epochs={epochs}",
                "--set", "checkpoint.every_steps=null", "--set", f"resources.cpu_threads={threads}"]
    main()


def command(variant: str, epochs: int, work: Path, threads: int) -> list[str]:
    if variant in BARE:
        return bare_command(variant, epochs, threads, work)
    return [sys.executable, str(Path(__file__).resolve()), "--variant", variant, "--epochs", str(epochs),
            "--store", str(work / "store"), "--threads", str(threads)]


def measure(epochs: int, repeats: int, threads: int = 1) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    steady: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(repeats):
        for variant in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
            with tempfile.TemporaryDirectory(prefix="baton-ablation-") as tmp:
                _, stamps = run_timed(command(variant, epochs, Path(tmp), threads), env)
            steady[variant].append(steady_epoch(stamps))
            print(f"  repeat {r}: {variant:>15} {steady[variant][-1] * 1e3:6.1f} ms an epoch", flush=True)
    bare = statistics.median(steady["bare"])
    return {"epochs": epochs, "repeats": repeats, "threads": threads,
            "variants": {v: {"steady_s": runs, "median_s": statistics.median(runs),
                             "vs_bare": statistics.median(runs) / bare} for v, runs in steady.items()}}


def print_table(result: dict) -> None:
    print(f"\nsteady-state epoch, median of {result['repeats']} interleaved runs of {result['epochs']} epochs")
    print(f"{'variant':>15} {'ms':>7} {'vs bare':>8}   runs (ms)")
    for variant, r in result["variants"].items():
        runs = " ".join(f"{s * 1e3:.1f}" for s in r["steady_s"])
        print(f"{variant:>15} {r['median_s'] * 1e3:>7.1f} {r['vs_bare']:>7.2f}x   {runs}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads, every variant")
    parser.add_argument("--out", default="bench/results/loop_ablation.json")
    parser.add_argument("--variant", choices=VARIANTS[2:], help=argparse.SUPPRESS)  # internal: run one variant
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant is not None:
        run_variant(args.variant, args.epochs, Path(args.store), args.threads)
        return
    result = measure(args.epochs, args.repeats, args.threads)
    print_table(result)
    write_result(result, args.out)


if __name__ == "__main__":
    main()
