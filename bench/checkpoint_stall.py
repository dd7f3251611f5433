"""How long a checkpoint blocks the training loop, against what it would cost synchronously.

For MLPs of about 1M, 25M and 100M parameters with AdamW state, on the file store and on an S3
endpoint over HTTP (moto's server on loopback), it measures side by side in one run:

- clone:  copying the state to fresh CPU tensors (the floor any snapshot must pay),
- stall:  what AsyncCheckpointer.save() blocks the loop for (capture + copy into reused buffers),
- sync:   torch.save + upload, what a synchronous checkpoint would block for,
- write:  the background serialization + upload + commit that async hides from the loop;

then, for the 25M model, training steps/s with a checkpoint every N steps against none: on a
machine with few cores the background write competes with training for the CPU, so the
whole-run cost is reported, not only the pause.

    python bench/checkpoint_stall.py [--sizes 1M,25M,100M] [--repeats 3] [--out bench/results/checkpoint_stall.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.services import S3Server  # noqa: E402
from schemas.spec import JobSpec  # noqa: E402
from storage.checkpoint_io import save_to_file  # noqa: E402
from storage.checkpointer import AsyncCheckpointer, CheckpointRequest  # noqa: E402
from storage.file_store import FileStore  # noqa: E402
from storage.layout import JobPaths  # noqa: E402
from storage.open import open_store  # noqa: E402
from workers import train_state  # noqa: E402
from workers.components import build_components  # noqa: E402
from workers.progress import BestTracker, Progress  # noqa: E402

HIDDEN = {"1M": 448, "25M": 2240, "100M": 4480}  # 6 hidden layers: 5 x hidden^2 weights dominate


def build(size: str):
    spec = JobSpec.parse({
        "name": f"bench-{size}", "seed": 0,
        "model": {"target": "builtin:mlp", "kwargs": {"in_features": 2, "hidden": HIDDEN[size], "layers": 6, "out_features": 3}},
        "data": {"target": "builtin:spiral", "kwargs": {"n_per_class": 200}, "batch_size": 64},
        "optimizer": {"name": "adamw", "lr": 1e-4}, "loop": {"epochs": 1},
    })
    parts = build_components(spec, torch.device("cpu"), ())
    train_step(parts)  # AdamW state exists from the first step
    return parts


def train_step(parts) -> None:
    x, y = next(iter(parts.data.train_loader(0)))
    parts.optimizer.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(parts.model(x), y).backward()
    parts.optimizer.step()


def capture(parts):
    return train_state.capture(parts, Progress(), BestTracker("val_loss", "min"), [], torch.get_num_threads())


def clone_state(state):
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, dict):
        return {k: clone_state(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(clone_state(v) for v in state)
    return state


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure_pause(parts, store, repeats: int) -> dict:
    paths = JobPaths("bench")
    clone = [timed(lambda: clone_state(capture(parts))) for _ in range(repeats)]
    ckpt = AsyncCheckpointer(store, paths, attempt=1, keep_last=2, log=lambda m: None)
    stalls, writes = [], []
    for i in range(repeats + 1):  # the first save allocates the reused buffers: reported apart
        request = CheckpointRequest(step=i, epoch=0, batch_in_epoch=i, kind="step")
        stalls.append(timed(lambda: ckpt.save(lambda: capture(parts), request, mandatory=True)))
        ckpt.wait()
        writes.append(ckpt.totals.done[-1].write_s)
    ckpt.close()
    size = store.size(paths.for_attempt(1).checkpoint(repeats))
    sync = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            path = Path(tmp) / "sync.pt"
            sync.append(timed(lambda: (save_to_file(clone_state(capture(parts)), path), store.put_file("jobs/bench/sync.pt", path))))
    for key in store.list("jobs/bench/"):
        store.delete(key)
    return {"bytes": size, "clone_s": statistics.median(clone), "first_stall_s": stalls[0],
            "stall_s": statistics.median(stalls[1:]), "write_s": statistics.median(writes[1:]),
            "sync_s": statistics.median(sync)}


def measure_throughput(parts, store, steps: int, intervals: list[int]) -> dict:
    results = {}
    for label, interval in [("none", None)] + [(f"every_{n}", n) for n in intervals]:
        ckpt = AsyncCheckpointer(store, JobPaths("bench-tput"), attempt=1, keep_last=2, log=lambda m: None)
        train_step(parts)  # warm
        started = time.perf_counter()
        for step in range(1, steps + 1):
            train_step(parts)
            if interval and step % interval == 0:
                ckpt.save(lambda: capture(parts), CheckpointRequest(step, 0, step, "step"), mandatory=False)
        ckpt.close()
        elapsed = time.perf_counter() - started
        results[label] = {"steps_per_s": steps / elapsed, "checkpoints": ckpt.totals.taken, "skipped": ckpt.totals.skipped}
        for key in store.list("jobs/bench-tput/"):
            store.delete(key)
    for n in intervals:
        results[f"every_{n}"]["slowdown"] = results["none"]["steps_per_s"] / results[f"every_{n}"]["steps_per_s"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1M,25M,100M")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="training steps per throughput run (25M)")
    parser.add_argument("--every", default="10,30", help="checkpoint intervals of the throughput runs")
    parser.add_argument("--out", default="bench/results/checkpoint_stall.json")
    args = parser.parse_args()

    server = S3Server().start()
    os.environ.update(server.env())
    server.create_bucket("bench")
    stores = {"file": FileStore(tempfile.mkdtemp(prefix="baton-bench-")), "s3": open_store("s3://bench")}
    rows, throughput = [], {}
    try:
        for size in args.sizes.split(","):
            parts = build(size)
            params = sum(p.numel() for p in parts.model.parameters())
            for name, store in stores.items():
                row = {"size": size, "params": params, "store": name, **measure_pause(parts, store, args.repeats)}
                row["stall_over_clone"] = row["stall_s"] / row["clone_s"]
                row["stall_over_sync"] = row["stall_s"] / row["sync_s"]
                rows.append(row)
                print(f"  {size} {name}: stall {row['stall_s'] * 1e3:.1f} ms, sync {row['sync_s'] * 1e3:.0f} ms", flush=True)
            if size == "25M":
                intervals = [int(n) for n in args.every.split(",")]
                throughput = {name: measure_throughput(parts, store, args.steps, intervals) for name, store in stores.items()}
            del parts
    finally:
        server.stop()

    print(f"\ncheckpoint pause, median of {args.repeats} (torch {torch.__version__}, {os.cpu_count()} cores, "
          f"{torch.get_num_threads()} torch threads)")
    header = f"{'model':>6} {'params':>12} {'store':>5} {'MB':>7} {'clone ms':>9} {'stall ms':>9} {'1st stall':>9} " \
             f"{'sync ms':>8} {'bg write':>8} {'stall/clone':>11} {'stall/sync':>10}"
    print(header)
    for r in rows:
        print(f"{r['size']:>6} {r['params']:>12,} {r['store']:>5} {r['bytes'] / 1e6:>7.1f} {r['clone_s'] * 1e3:>9.1f} "
              f"{r['stall_s'] * 1e3:>9.1f} {r['first_stall_s'] * 1e3:>9.1f} {r['sync_s'] * 1e3:>8.0f} "
              f"{r['write_s'] * 1e3:>8.0f} {r['stall_over_clone']:>11.2f} {r['stall_over_sync']:>10.3f}")
    if throughput:
        print(f"\n25M training, {args.steps} steps: no checkpoints vs one every N steps (async)")
        print(f"{'store':>5} {'every':>6} {'steps/s':>8} {'slowdown':>9} {'taken':>6} {'skipped':>8}")
        for name, t in throughput.items():
            for label, r in t.items():
                every = label.split("_")[-1]
                print(f"{name:>5} {every:>6} {r['steps_per_s']:>8.2f} {r.get('slowdown', 1.0):>8.2f}x "
                      f"{r['checkpoints']:>6} {r['skipped']:>8}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                                           "torch": torch.__version__, "python": platform.python_version()},
                               "repeats": args.repeats, "pause": rows, "throughput_25M": throughput}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
