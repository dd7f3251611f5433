"""Sharded checkpoints of one FSDP2 model on 2 ranks: baton's against torch.distributed.checkpoint's.

Two ranks (gloo on the CPU, NCCL with --device cuda) shard an MLP of ``--layers`` square Linear
layers of ``--width`` (default 8 x 2048: 33.6M parameters; fp32 weights and AdamW's two moments make
a checkpoint of about 400 MB in all, 200 MB per rank) with ``fully_shard`` per layer, and train it
on random batches. Each mode runs the same ``--steps`` steps, side by side in one run, a checkpoint
every ``--every`` steps:

- ``none``: no checkpoint (the throughput every other mode is compared with);
- ``baton``: ``ShardedCheckpointer``: the stall is a host copy of the rank's shard into reused buffers;
  DCP's save into the rank's spool, sha256, the upload to a file:// store and the fenced manifest
  commit run in a background thread;
- ``dcp_async``: ``torch.distributed.checkpoint.async_save`` (its default: stage to CPU, save in a
  thread) into a local directory, on a gloo group of its own; no hashing, upload or commit;
- ``dcp_sync``: ``torch.distributed.checkpoint.save``: the loop waits for the whole write.

A periodic checkpoint due while the previous is still being written is skipped in the baton and
dcp_async modes alike. Each mode runs in fresh rank processes. Per mode (the slower rank's figure):
stall per checkpoint (median, max; baton's includes any wait for its overlapped copy before the next
optimizer step), steps/s over the whole run (the last checkpoint awaited) and its ratio to ``none``,
checkpoints taken and skipped, and what checkpointing adds to the rank's peak host RSS (sampled every
2 ms, above its RSS before the run, less the same figure without checkpoints), over its shard's bytes,
and, for baton, the host buffers its snapshot holds over the shard's bytes. On the CPU the RSS
figure is only indicative: the training's own memory is host memory too, and the allocator hands
memory the step freed (gathered parameters, gradients) to the snapshot without the RSS growing.

    python bench/sharded_checkpoint.py [--steps 40] [--every 10] [--out bench/results/sharded_checkpoint.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
MODES = ("none", "baton", "dcp_async", "dcp_sync")


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakRss:
    """The highest RSS seen while it runs (a thread sampling /proc every 2 ms)."""

    def __init__(self):
        self.peak, self._stop = rss_bytes(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss_bytes())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, rss_bytes())


def rank_main(rank: int, args) -> dict:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from baton.storage.checkpointing.contract import CheckpointRequest, CheckpointTarget
    from baton.storage.stores.file_store import FileStore
    from baton.storage.layout import JobPaths
    from baton.workers.parallel.distributed import RankGroup, RankSeat
    from baton.workers.parallel.fsdp import shard_model
    from baton.workers.parallel.rendezvous import open_store
    from baton.workers.parallel.sharded_checkpoint import ShardedCheckpointer
    from baton.workers.parallel.sharded_state import sharded_parts
    from baton.workers.training.batches import tensors
    from baton.workers.training.progress import Progress

    torch.set_num_threads(args.threads)
    root = Path(args.root)
    group = RankGroup.join(open_store(root, 2, 60, args.secret), RankSeat(rank, 2, args.device), args.secret, seed=0, sharded=True)
    device = group.device
    results = {}
    for mode in [args.mode]:
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU()) for _ in range(args.layers)])
        model = shard_model(model.to(device), init_device_mesh(device.type, (2,)), "fp32")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        parts = SimpleNamespace(model=model, optimizer=optimizer, device=device)

        def train_step(i: int) -> None:
            g = torch.Generator().manual_seed(i * 2 + rank)
            x = torch.randn(args.batch, args.width, generator=g).to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = model(x).pow(2).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if checkpointer is not None:
                checkpointer.before_optimizer_step()
            optimizer.step()

        checkpointer = None
        train_step(-1)  # optimizer state exists: every checkpoint holds it
        shard_bytes = sum(t.to_local().numel() * t.element_size() for part in sharded_parts(parts).values()
                          for t in tensors(part) if isinstance(t, DTensor))
        store = FileStore(root / f"store-{mode}")
        if mode == "baton":
            checkpointer = ShardedCheckpointer(group, parts, CheckpointTarget(store, JobPaths(f"bench-{mode}"), 1, 2,
                                                                              log=lambda message: None))
        stalls, taken, skipped, pending = [], 0, 0, None
        own = lambda: {"format": 1, "progress": Progress().state_dict(), "config": {}}  # noqa: E731
        dist.barrier(group=group.control_group)
        baseline = rss_bytes()
        peak = PeakRss()
        started = time.perf_counter()
        for step in range(1, args.steps + 1):
            train_step(step)
            if step % args.every:
                continue
            t0 = time.perf_counter()
            if mode == "baton":
                request = CheckpointRequest(step=step, epoch=0, batch_in_epoch=step, kind="step")
                if checkpointer.save(own, request, mandatory=False):
                    taken += 1
                    stalls.append(time.perf_counter() - t0)
                else:
                    skipped += 1
            elif mode == "dcp_async":
                busy = pending is not None and not pending.done()
                if group.any_rank(busy):
                    skipped += 1
                    continue
                if pending is not None:
                    pending.result()
                t0 = time.perf_counter()
                pending = dcp.async_save(sharded_parts(parts), checkpoint_id=str(root / f"{mode}-{step}"),
                                         process_group=group.checkpoint_group)
                stalls.append(time.perf_counter() - t0)
                taken += 1
            elif mode == "dcp_sync":
                dcp.save(sharded_parts(parts), checkpoint_id=str(root / f"{mode}-{step}"),
                         process_group=group.checkpoint_group)
                stalls.append(time.perf_counter() - t0)
                taken += 1
        buffers = 0
        if checkpointer is not None:
            checkpointer.close()
            stalls = [stats.stall_s for stats in checkpointer._taken]  # the waits before a step included
            buffers = sum(b.numel() * b.element_size() for b in checkpointer._snapshot._buffers.values())
        if pending is not None:
            pending.result()
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        extra = peak.stop() - baseline
        dist.barrier(group=group.control_group)
        results[mode] = {"steps_per_s": args.steps / elapsed, "stall_median_s": statistics.median(stalls) if stalls else 0.0,
                         "stall_max_s": max(stalls) if stalls else 0.0, "taken": taken, "skipped": skipped,
                         "shard_bytes": shard_bytes, "extra_rss_bytes": extra, "buffer_bytes": buffers}
    group.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--out", default=str(REPO / "bench/results/sharded_checkpoint.json"))
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--secret", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        result = rank_main(args.rank, args)
        Path(args.root, f"rank-{args.rank}.json").write_text(json.dumps(result))
        return
    from baton.workers.parallel.rendezvous import new_secret

    ranks: list[dict] = [{}, {}]
    for mode in MODES:  # each in fresh processes: one mode's freed memory must not hide another's peak
        with tempfile.TemporaryDirectory(prefix="baton-bench-sharded-") as root:
            base = [sys.executable, __file__, "--root", root, "--secret", new_secret(), "--mode", mode, *sys.argv[1:]]
            procs = [subprocess.Popen(base + ["--rank", str(rank)]) for rank in (0, 1)]
            codes = [proc.wait() for proc in procs]
            if any(codes):
                raise SystemExit(f"{mode}: a rank failed: exit codes {codes}")
            for rank in (0, 1):
                ranks[rank].update(json.loads(Path(root, f"rank-{rank}.json").read_text()))
    none = min(r["none"]["steps_per_s"] for r in ranks)
    rows = []
    for mode in MODES:
        per = [r[mode] for r in ranks]
        rows.append({
            "mode": mode,
            "steps_per_s": min(p["steps_per_s"] for p in per),
            "throughput_vs_none": min(p["steps_per_s"] for p in per) / none,
            "stall_median_ms": 1000 * max(p["stall_median_s"] for p in per),
            "stall_max_ms": 1000 * max(p["stall_max_s"] for p in per),
            "taken": per[0]["taken"], "skipped": per[0]["skipped"],
            "shard_mb": per[0]["shard_bytes"] / 1e6,
            "extra_rss_vs_shard": max(p["extra_rss_bytes"] / p["shard_bytes"] for p in per),
            "buffers_vs_shard": max(p["buffer_bytes"] / p["shard_bytes"] for p in per),
            "checkpoint_rss_vs_shard": max((p["extra_rss_bytes"] - r["none"]["extra_rss_bytes"]) / p["shard_bytes"]
                                           for p, r in zip(per, ranks)),
        })
    async_stall = next(r for r in rows if r["mode"] == "dcp_async")["stall_median_ms"]
    for row in rows:
        row["stall_vs_dcp_async"] = row["stall_median_ms"] / async_stall if async_stall else None
    print(f"{'mode':<10} {'steps/s':>8} {'vs none':>8} {'stall med ms':>13} {'stall max ms':>13} "
          f"{'vs async':>9} {'taken':>6} {'skipped':>8} {'buffers/shard':>14} {'ckpt RSS/shard':>15}")
    for r in rows:
        vs = f"{r['stall_vs_dcp_async']:.2f}x" if r["stall_vs_dcp_async"] is not None else "-"
        print(f"{r['mode']:<10} {r['steps_per_s']:>8.2f} {r['throughput_vs_none']:>7.3f}x {r['stall_median_ms']:>13.1f} "
              f"{r['stall_max_ms']:>13.1f} {vs:>9} {r['taken']:>6} {r['skipped']:>8} {r['buffers_vs_shard']:>13.2f}x {r['checkpoint_rss_vs_shard']:>14.2f}x")
    print(f"shard per rank: {rows[0]['shard_mb']:.0f} MB (model + AdamW state); checkpoint in all: "
          f"{2 * rows[0]['shard_mb']:.0f} MB")
    import torch

    out = {"argv": sys.argv[1:], "torch": torch.__version__, "machine": platform.machine(),
           "cpus": os.cpu_count(), "device": args.device, "rows": rows, "ranks": ranks}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
