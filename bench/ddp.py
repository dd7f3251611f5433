"""Data-parallel throughput and checkpoint stall: 1 rank against 2 ranks, through `baton run`.

One spiral MLP job (about 0.8M parameters, global batch 256, dropout 0.1, a checkpoint every 5
steps) run as:

- 1 rank, 1 torch thread (batch 256),
- 1 rank, 2 torch threads (batch 256): the same cores as 2 ranks, used by intra-op threads,
- 2 ranks, 1 thread each (batch 128 per rank: the same global batch and the same samples per step).

For each it reports training samples/s over the whole group (training samples of an epoch over
the epoch's wall time, median of the epochs after the first), rank 0's checkpoint stall (what its
loop waits for the snapshot, per checkpoint), each rank's own part of a checkpoint (capturing
and gathering its RNG/loader state to rank 0; a rank then waits at its next all-reduce while
rank 0 snapshots), the first and last validation loss (the 2-rank curve differs from the 1-rank
one by rank 1's dropout masks), and the wall time of the whole `baton run` (process start,
rendezvous and finalization included).

    python bench/ddp.py [--epochs 4] [--repeats 2] [--out bench/results/ddp.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from baton.storage.artifacts import read_metrics  # noqa: E402
from baton.storage.stores.file_store import FileStore  # noqa: E402
from baton.storage.layout import JobPaths  # noqa: E402
from baton.storage.manifest_store import ManifestStore  # noqa: E402

GLOBAL_BATCH = 256
N_PER_CLASS = 2000  # 6000 samples, 4800 train: 19 steps of 256 per epoch


def spec(processes: int, threads: int, epochs: int) -> dict:
    return {
        "name": f"ddp-bench-{processes}x{threads}", "seed": 7,
        "model": {"target": "builtin:mlp", "kwargs": {"in_features": 2, "hidden": 512, "layers": 4, "out_features": 3,
                                                      "dropout": 0.1}},
        "data": {"target": "builtin:spiral", "kwargs": {"n_per_class": N_PER_CLASS},
                 "batch_size": GLOBAL_BATCH // processes, "val_fraction": 0.2},
        "optimizer": {"name": "adamw", "lr": 1e-3},
        "scheduler": {"name": "onecycle", "warmup_fraction": 0.2},
        "loop": {"epochs": epochs, "deterministic": True},
        "checkpoint": {"every_steps": 5, "keep_last": 3, "min_interval_s": 0},
        "resources": {"device": "cpu", "cpu_threads": threads, "processes": processes},
    }


def run_once(processes: int, threads: int, epochs: int, root: Path, tag: str) -> dict:
    spec_path = root / f"{tag}.yaml"
    spec_path.write_text(yaml.safe_dump(spec(processes, threads, epochs)))
    store_dir = root / f"store-{tag}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "baton", "run", str(spec_path), "--id", tag, "--storage",
                           f"file://{store_dir}", "--no-progress"], env=env, capture_output=True, text=True, cwd=REPO)
    wall_s = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{tag} failed:\n{done.stdout}\n{done.stderr}")
    store = FileStore(store_dir)
    rows = read_metrics(store, ManifestStore(store, JobPaths(tag)).read())
    n_train = 3 * N_PER_CLASS - round(3 * N_PER_CLASS * 0.2)
    per_epoch = [n_train / r["epoch_s"] for r in rows[1:]] or [n_train / rows[0]["epoch_s"]]
    stalls = [r["ckpt_stall_s"] / r["ckpt_count"] for r in rows if r["ckpt_count"]]
    gathers = {int(m[1]): float(m[2]) / 1000 for m in
               re.finditer(r"rank (\d+)\]?:? \d+ checkpoint gathers, mean ([\d.]+) ms", done.stdout + done.stderr)}
    return {"processes": processes, "threads": threads, "samples_per_s": statistics.median(per_epoch),
            "stall_rank0_s": statistics.median(stalls) if stalls else None,
            "gather_s": {str(k): v for k, v in sorted(gathers.items())},
            "val_loss_first": rows[0]["val_loss"], "val_loss_last": rows[-1]["val_loss"], "wall_s": wall_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "ddp.json"))
    args = parser.parse_args()
    configs = [(1, 1), (1, 2), (2, 1)]
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="baton-ddp-bench-") as tmp:
        for repeat in range(args.repeats):  # interleaved, so the machine's drift hits every configuration
            for processes, threads in configs:
                results.append({**run_once(processes, threads, args.epochs, Path(tmp), f"r{repeat}-{processes}x{threads}"),
                                "repeat": repeat})
    print(f"{'ranks x threads':>16} {'samples/s':>10} {'vs 1x1':>7} {'stall r0 ms':>11} {'gather ms (per rank)':>22} "
          f"{'val_loss first->last':>21} {'wall s':>7}")
    base = statistics.median(r["samples_per_s"] for r in results if (r["processes"], r["threads"]) == (1, 1))
    for r in results:
        gathers = ", ".join(f"r{k} {1000 * v:.2f}" for k, v in r["gather_s"].items()) or "-"
        stall = f"{1000 * r['stall_rank0_s']:.2f}" if r["stall_rank0_s"] is not None else "-"
        print(f"{r['processes']:>10} x {r['threads']:<3} {r['samples_per_s']:>10.0f} {r['samples_per_s'] / base:>6.2f}x "
              f"{stall:>11} {gathers:>22} {r['val_loss_first']:>9.4f} -> {r['val_loss_last']:.4f} {r['wall_s']:>7.1f}")
    load = os.getloadavg()
    out = {"results": results, "epochs": args.epochs, "global_batch": GLOBAL_BATCH, "cpus": os.cpu_count(),
           "load_average_at_end": load, "python": platform.python_version(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"load average at the end: {load[0]:.1f} on {os.cpu_count()} cores; results in {args.out}")


if __name__ == "__main__":
    main()
