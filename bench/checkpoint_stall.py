"""baton's checkpoint against the peers a user would reach for, on the same state, in one run.

For MLPs of about 1M, 25M and 100M parameters with AdamW state, on the file store and on an S3
endpoint over HTTP (moto's server on loopback), interleaved repeats (the order rotates) of:

- baton: AsyncCheckpointer.save(), what the loop waits for (capture + copy into reused buffers);
  the background serialization + sha256 + upload + commit is reported as ``write``;
- dcp:   ``torch.distributed.checkpoint.async_save`` (thread-based, ``no_dist``: one process), to a
  local directory: DCP has no S3 writer without s3fs, so its row is the same for both stores;
- sync:  ``torch.save`` + upload, a synchronous checkpoint;
- clone: copying the state to fresh CPU tensors (the floor of a snapshot into new memory).

Then, for the 25M model (301 MB with AdamW), whole-run training throughput with a checkpoint
every N steps by each of them against none, interleaved the same way: on a machine with few
cores the background work competes with training for the CPU, so the pause alone says little.
``--baton-run-pairs`` adds the same comparison through real ``baton run`` processes (one epoch
of ~128 steps, ``checkpoint.every_steps`` N against null), whole-process wall time.

    python bench/checkpoint_stall.py [--sizes 1M,25M] [--repeats 3] [--every 20] [--baton-run-pairs 2]
    python bench/checkpoint_stall.py --smoke     # seconds: every path once, tiny model, no JSON
    python bench/checkpoint_stall.py --device cuda --stores file --sizes 25M,100M --steps 300 --every 50

With ``--device cuda`` the state lives on the GPU: baton's snapshot copies it into reused pinned
host buffers, and in the throughput runs (as in the real loop) the parameters' and optimizer
state's copies run on a side stream while the next forward and backward do; ``clone`` is a copy
to fresh host memory. Each timed pause starts after the GPU has finished the work queued before it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from baton.jobs.services import S3Server  # noqa: E402
from baton.schemas.spec import JobSpec  # noqa: E402
from baton.storage.checkpointing.contract import CheckpointTarget
from baton.storage.checkpointing.checkpointer import AsyncCheckpointer  # noqa: E402
from baton.storage.checkpointing.contract import CheckpointRequest
from baton.storage.stores.file_store import FileStore  # noqa: E402
from baton.storage.layout import JobPaths  # noqa: E402
from baton.storage.stores.open import open_store  # noqa: E402
from baton.storage.checkpointing.plain import unwrap  # noqa: E402
from baton.workers.training import train_state  # noqa: E402
from baton.workers.training.components import build_components  # noqa: E402
from baton.workers.training.progress import BestTracker, Progress  # noqa: E402

DEVICE = torch.device("cpu")  # --device
HIDDEN = {"tiny": 32, "1M": 448, "25M": 2240, "100M": 4480}  # 6 hidden layers: 5 x hidden^2 weights dominate


def build(size: str):
    spec = JobSpec.parse({
        "name": f"bench-{size}", "seed": 0,
        "model": {"target": "builtin:mlp", "kwargs": {"in_features": 2, "hidden": HIDDEN[size], "layers": 6, "out_features": 3}},
        "data": {"target": "builtin:spiral", "kwargs": {"n_per_class": 200}, "batch_size": 64},
        "optimizer": {"name": "adamw", "lr": 1e-4}, "loop": {"epochs": 1},
    })
    parts = build_components(spec, DEVICE, ())
    train_step(parts)  # AdamW state exists from the first step
    return parts


_BATCHES: dict[int, tuple] = {}


def train_step(parts, before_step=None) -> None:
    """One AdamW step on a fixed batch (the first of the first epoch); ``before_step`` is called
    before the optimizer modifies the parameters, as the loop calls the checkpointer's."""
    if id(parts) not in _BATCHES:
        _BATCHES[id(parts)] = tuple(t.to(DEVICE) for t in next(iter(parts.data.train_batches(0))))
    x, y = _BATCHES[id(parts)]
    parts.optimizer.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(parts.model(x), y).backward()
    if before_step is not None:
        before_step()
    parts.optimizer.step()


def sync() -> None:
    """Wait for the GPU's queued work (a no-op on the CPU): a timed pause starts from an idle device."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def capture(parts):
    """The state baton checkpoints, as plain containers (torch.save and DCP take it as it is)."""
    return unwrap(train_state.capture(parts, Progress(), BestTracker("val_loss", "min"), [], torch.get_num_threads()))


def clone_state(state):
    """A copy into fresh host memory (on the CPU, a clone)."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: clone_state(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(clone_state(v) for v in state)
    return state


def timed(fn) -> float:
    sync()
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def rotated(items: list, r: int) -> list:
    """The r-th rotation: each method goes first, middle and last equally often across repeats."""
    k = r % len(items)
    return items[k:] + items[:k]


class Dcp:
    """torch.distributed.checkpoint.async_save into a fresh local directory per checkpoint."""

    def __init__(self):
        import torch.distributed.checkpoint as dcp

        self.dcp, self.root, self.n, self.future = dcp, Path(tempfile.mkdtemp(prefix="baton-bench-dcp-")), 0, None

    def save(self, parts) -> None:
        self.wait()
        self.n += 1
        state = {"model": parts.model.state_dict(), "optim": parts.optimizer.state_dict()}
        with warnings.catch_warnings():  # "torch.distributed is disabled ... single process": intended
            warnings.simplefilter("ignore")
            self.future = self.dcp.async_save(state, checkpoint_id=str(self.root / f"step-{self.n}"), no_dist=True)

    def wait(self) -> None:
        if self.future is not None:
            self.future.result()
            self.future = None
            for old in sorted(self.root.iterdir())[:-1]:  # keep the last, like keep_last
                shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        self.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def sync_save(parts, store, key: str) -> None:
    """A synchronous checkpoint: torch.save of the live state, then the upload."""
    with tempfile.NamedTemporaryFile(dir=store.scratch_dir(), suffix=".pt", delete=False) as fh:
        path = Path(fh.name)
    torch.save(capture(parts), path)
    store.put_file(key, path, consume=True)
    path.unlink(missing_ok=True)


def clean(store, prefix: str) -> None:
    for key in store.list(prefix):
        store.delete(key)


def measure_pause(parts, store, repeats: int) -> dict:
    """Median stall of each method, interleaved: one of each per repeat, order rotating."""
    paths = JobPaths("bench")
    ckpt = AsyncCheckpointer(CheckpointTarget(store, paths, attempt=1, keep_last=2, log=lambda m: None),
                             pin_memory=DEVICE.type == "cuda")
    ckpt.wait_for_writer()  # its writer process starts during a real attempt's start-up
    dcp = Dcp()
    first = timed(lambda: ckpt.save(lambda: capture(parts), CheckpointRequest(0, 0, 0, "step"), mandatory=True))
    ckpt.wait()  # the first save allocates the reused buffers: reported apart
    times: dict[str, list[float]] = {"clone": [], "baton": [], "dcp": [], "sync": []}
    writes = []
    for r in range(repeats):
        for method in rotated(["baton", "dcp", "sync", "clone"], r):
            if method == "baton":
                request = CheckpointRequest(step=r + 1, epoch=0, batch_in_epoch=r + 1, kind="step")
                times["baton"].append(timed(lambda: ckpt.save(lambda: capture(parts), request, mandatory=True)))
                ckpt.wait()
                writes.append(ckpt.totals.done[-1].write_s)
            elif method == "dcp":
                times["dcp"].append(timed(lambda: dcp.save(parts)))
                dcp.wait()
            elif method == "sync":
                times["sync"].append(timed(lambda: sync_save(parts, store, "jobs/bench/sync.pt")))
            else:
                times["clone"].append(timed(lambda: clone_state(capture(parts))))
    ckpt.close()
    dcp.close()
    size = store.size(paths.for_attempt(1).checkpoint(repeats))
    clean(store, "jobs/bench/")
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"bytes": size, "first_stall_s": first, "write_s": statistics.median(writes),
            **{f"{k}_s": v for k, v in med.items()}, "samples_s": times,
            "stall_over_dcp": med["baton"] / med["dcp"], "stall_over_sync": med["baton"] / med["sync"],
            "stall_over_clone": med["baton"] / med["clone"]}


def run_steps(parts, steps: int, every: int, method: str, store) -> float:
    """steps/s over ``steps`` training steps with a checkpoint every ``every`` by ``method``,
    including the wait for the last one (a run is over when its checkpoint is)."""
    ckpt = AsyncCheckpointer(CheckpointTarget(store, JobPaths("bench-tput"), attempt=1, keep_last=2, log=lambda m: None),
                             pin_memory=DEVICE.type == "cuda") if method == "baton" else None
    if ckpt is not None:
        ckpt.wait_for_writer()  # its writer process starts during a real attempt's start-up
    dcp = Dcp() if method == "dcp" else None
    stable = train_state.stable_storages(parts)
    before_step = ckpt.before_optimizer_step if ckpt is not None else None
    train_step(parts)  # warm
    sync()
    started = time.perf_counter()
    for step in range(1, steps + 1):
        train_step(parts, before_step)
        if method == "none" or step % every:
            continue
        if method == "baton":
            ckpt.save(lambda: capture(parts), CheckpointRequest(step, 0, step, "step"), mandatory=False, stable=stable)
        elif method == "dcp":
            dcp.save(parts)
        else:
            sync_save(parts, store, f"jobs/bench-tput/sync-{step}.pt")
    if ckpt is not None:
        ckpt.close()
    if dcp is not None:
        dcp.close()
    sync()
    elapsed = time.perf_counter() - started
    clean(store, "jobs/bench-tput/")
    return steps / elapsed


def measure_throughput(parts, stores: dict, steps: int, every: int, repeats: int) -> dict:
    """Per repeat one run of each (method, store), order rotating; ratios against the median of
    the no-checkpoint runs, and against the no-checkpoint run of the same repeat."""
    runs = [("none", "file"), ("dcp", "local")] + [(m, s) for s in stores for m in ("baton", "sync")]
    rates: dict[str, list[float]] = {f"{m}/{s}": [] for m, s in runs}
    for r in range(repeats):
        for method, store_name in rotated(runs, r):
            rate = run_steps(parts, steps, every, method, stores.get(store_name, stores["file"]))
            rates[f"{method}/{store_name}"].append(rate)
            print(f"    repeat {r}: {method:>5}/{store_name:<5} {rate:.3f} steps/s", flush=True)
    none = rates["none/file"]
    out = {}
    for label, values in rates.items():
        out[label] = {"steps_per_s": statistics.median(values), "samples": values,
                      "vs_none": statistics.median(values) / statistics.median(none),
                      "vs_none_same_repeat": [v / n for v, n in zip(values, none)]}
    return out


BATON_RUN_SPEC = {
    "name": "bench-25m", "seed": 0,
    "model": {"target": "builtin:mlp", "kwargs": {"in_features": 2, "hidden": HIDDEN["25M"], "layers": 6,
                                                  "out_features": 3}},
    "data": {"target": "builtin:spiral", "kwargs": {"n_per_class": 3414}, "batch_size": 64, "val_fraction": 0.2,
             "val_batch_size": 1024},
    "optimizer": {"name": "adamw", "lr": 1e-4}, "scheduler": {"name": "none"},
    "loop": {"epochs": 1}, "checkpoint": {"every_steps": None, "keep_last": 2},
}


def measure_baton_run(pairs: int, every: int) -> dict:
    """``baton run`` of the 25M model for one epoch (128 steps), checkpoint every N vs none, in
    separate processes, interleaved (the order alternates); whole-process wall times."""
    root = Path(__file__).resolve().parents[1]
    times: dict[str, list[float]] = {"none": [], f"every_{every}": []}
    with tempfile.TemporaryDirectory(prefix="baton-bench-run-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(BATON_RUN_SPEC))
        for r in range(pairs):
            order = ["none", f"every_{every}"] if r % 2 == 0 else [f"every_{every}", "none"]
            for label in order:
                setting = "null" if label == "none" else str(every)
                cmd = [sys.executable, "-m", "baton", "run", str(spec_path), "--id", f"{label}-{r}", "--storage",
                       f"file://{tmp}/store", "--no-progress", "--set", f"checkpoint.every_steps={setting}"]
                elapsed = timed(lambda: subprocess.run(cmd, check=True, cwd=root, stdout=subprocess.DEVNULL,
                                                       env={**os.environ, "PYTHONPATH": str(root)}))
                times[label].append(elapsed)
                shutil.rmtree(Path(tmp) / "store", ignore_errors=True)
                print(f"    baton run pair {r}: {label:>9} {elapsed:.1f} s", flush=True)
    ratios = [n / e for n, e in zip(times["none"], times[f"every_{every}"])]
    return {"every": every, "wall_s": times, "throughput_ratios": ratios, "median_ratio": statistics.median(ratios)}


def print_tables(args, rows: list[dict], throughput: dict, baton_run: dict) -> None:
    load = os.getloadavg()
    print(f"\ncheckpoint stall, median of {args.repeats} interleaved repeats (torch {torch.__version__}, "
          f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads, load avg {load[0]:.1f}, {device_name()})")
    print(f"{'model':>6} {'store':>5} {'MB':>7} {'baton ms':>9} {'dcp ms':>8} {'sync ms':>8} {'clone ms':>9} "
          f"{'bg write':>9} {'baton/dcp':>9} {'baton/sync':>10}")
    for r in rows:
        print(f"{r['size']:>6} {r['store']:>5} {r['bytes'] / 1e6:>7.1f} {r['baton_s'] * 1e3:>9.1f} "
              f"{r['dcp_s'] * 1e3:>8.1f} {r['sync_s'] * 1e3:>8.0f} {r['clone_s'] * 1e3:>9.1f} "
              f"{r['write_s'] * 1e3:>9.0f} {r['stall_over_dcp']:>9.2f} {r['stall_over_sync']:>10.3f}")
    if throughput:
        print(f"\n25M training, {args.steps} steps, a checkpoint every {args.every}: steps/s against none "
              f"(median of {args.throughput_repeats or args.repeats}; per repeat against that repeat's none run)")
        print(f"{'method/store':>13} {'steps/s':>8} {'vs none':>8}  per repeat")
        for label, t in throughput.items():
            per = " ".join(f"{x:.2f}" for x in t["vs_none_same_repeat"])
            print(f"{label:>13} {t['steps_per_s']:>8.3f} {t['vs_none']:>7.2f}x  {per}")
    if baton_run:
        e = baton_run["every"]
        print(f"\nbaton run, 25M, one 128-step epoch: checkpoint every {e} vs none (process wall time)")
        for n, c, ratio in zip(baton_run["wall_s"]["none"], baton_run["wall_s"][f"every_{e}"],
                               baton_run["throughput_ratios"]):
            print(f"  none {n:6.1f} s  every {e} {c:6.1f} s  throughput {ratio:.2f}x")
        print(f"  median {baton_run['median_ratio']:.2f}x")


def device_name() -> str:
    return torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else "CPU"


def main() -> None:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1M,25M")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="training steps per throughput run (25M)")
    parser.add_argument("--every", type=int, default=20, help="checkpoint interval of the throughput runs")
    parser.add_argument("--throughput-repeats", type=int, help="repeats of the throughput runs (default: --repeats)")
    parser.add_argument("--baton-run-pairs", type=int, default=0, help="interleaved pairs of real `baton run`s")
    parser.add_argument("--smoke", action="store_true", help="every path once on a tiny model; writes nothing")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the model and its state live")
    parser.add_argument("--stores", default="file,s3", help="file, s3 (moto's server on loopback), or both")
    parser.add_argument("--out", default=None, help="default bench/results/checkpoint_stall[_cuda].json")
    args = parser.parse_args()
    DEVICE = torch.device(args.device)
    args.out = args.out or f"bench/results/checkpoint_stall{'_cuda' if DEVICE.type == 'cuda' else ''}.json"
    if args.smoke:
        args.sizes, args.repeats, args.steps, args.every = "tiny", 1, 4, 2
    throughput_size = "tiny" if args.smoke else "25M"

    wanted = args.stores.split(",")
    server = S3Server().start() if "s3" in wanted else None
    stores = {"file": FileStore(tempfile.mkdtemp(prefix="baton-bench-"))} if "file" in wanted else {}
    if server is not None:
        os.environ.update(server.env())
        server.create_bucket("bench")
        stores["s3"] = open_store("s3://bench")
    rows, throughput = [], {}
    try:
        for size in args.sizes.split(","):
            parts = build(size)
            params = sum(p.numel() for p in parts.model.parameters())
            for name, store in stores.items():
                row = {"size": size, "params": params, "store": name, **measure_pause(parts, store, args.repeats)}
                rows.append(row)
                print(f"  {size} {name}: stall baton {row['baton_s'] * 1e3:.1f} ms, dcp {row['dcp_s'] * 1e3:.1f} ms, "
                      f"sync {row['sync_s'] * 1e3:.0f} ms", flush=True)
            if size == throughput_size:
                throughput = measure_throughput(parts, stores, args.steps, args.every,
                                                args.throughput_repeats or args.repeats)
            del parts
    finally:
        if server is not None:
            server.stop()
    baton_run = measure_baton_run(args.baton_run_pairs, args.every) if args.baton_run_pairs else {}
    print_tables(args, rows, throughput, baton_run)
    if args.smoke:
        return
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                                           "torch": torch.__version__, "python": platform.python_version(),
                                           "load_avg": os.getloadavg(), "device": device_name()},
                               "repeats": args.repeats, "throughput_repeats": args.throughput_repeats or args.repeats,
                               "steps": args.steps, "every": args.every,
                               "pause": rows, "throughput_25M": throughput, "baton_run_25M": baton_run}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
