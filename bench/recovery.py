"""How fast a job comes back after a fault, how much training it redoes, and what keeping the last
step in memory costs.

Real redis-server, S3 endpoint (moto) and two `baton worker` processes on this machine. For each
trial a job is submitted; once it trains, one fault:

- crash: the job's training process gets SIGKILL (its worker lives: the OOM killer, a segfault);
  its copies in memory taken as ``auto`` chooses;
- crash-1: the same, with a copy after every step (``checkpoint.memory_every_steps: 1``);
- SIGTERM: its worker gets SIGTERM (a spot notice);
- node: its worker's whole process group gets SIGKILL (the node is gone).

Measured from the signal, by the job's own model (``bench.probes.counting_mlp``: every training
forward appends the time to a file per process), not by baton's records:

- back s: until the first training step of the process that took over;
- redone: steps the dead process had trained (or begun) past the point the next one resumed from.

Then the cost of the in-memory copies on the loop, runs with ``checkpoint.memory_every_steps`` auto
(and 1) against off, interleaved: in one process (``run_attempt`` on a file store, the loop alone)
for a small and a 25M-parameter model, and through a worker (the job's training time from its
metrics rows). ``baton run`` keeps no copies (it has no worker to keep them for it).

    python bench/recovery.py [--trials 3] [--cost-repeats 3] [--out bench/results/recovery.json]

``--job-users worker,own`` runs each fault's trials under both users of a root worker's jobs, alternated,
on two pairs of workers (one queue each): ``BATON_JOB_USER=worker`` (the job as the worker's own user)
and the default (a uid of its own); ``--faults crash,crash-1`` measures only those.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from baton.jobs.client import JobClient  # noqa: E402
from baton.jobs.services import RedisServer, S3Server, WorkerProcess, stop_workers  # noqa: E402
from baton.schemas.settings import BatonSettings  # noqa: E402
from bench.probes import counted_in, forwards  # noqa: E402

SPEC = {
    "name": "recovery", "seed": 3,
    "model": {"target": "builtin:mlp", "kwargs": {"in_features": 2, "hidden": 256, "layers": 3, "out_features": 3}},
    "data": {"target": "builtin:spiral", "kwargs": {"n_per_class": 20000}, "batch_size": 256},
    "optimizer": {"name": "adamw", "lr": 1e-3},
    "loop": {"epochs": 50}, "checkpoint": {"every_steps": 20, "keep_last": 3, "min_interval_s": 0},
}
LARGE = {**SPEC, "model": {"target": "builtin:mlp", "kwargs": {"in_features": 2, "hidden": 2896, "layers": 4,
                                                               "out_features": 3}},
         "data": {**SPEC["data"], "kwargs": {"n_per_class": 800}}, "loop": {"epochs": 5}}
"""About 25M parameters (301 MB of state with AdamW's): the copy costs more than 3 % of a step, so
``auto`` spaces the copies out."""
FAULTS = ("crash", "crash-1", "SIGTERM", "node")


def poll(fn, timeout_s: float = 120, every_s: float = 0.01):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(every_s)
    raise TimeoutError("gave up waiting")


def counting(spec: dict, directory: Path) -> dict:
    """``spec`` with its model counting its own training steps into ``directory``."""
    return {**copy.deepcopy(spec), "model": {"target": "bench.probes:counting_mlp",
                                             "kwargs": {"directory": str(directory), **spec["model"]["kwargs"]}}}


JOB_USERS = {"worker": "worker", "own": ""}
"""``--job-users``: the name in the table, and BATON_JOB_USER."""


def trial(client: JobClient, workers: list[WorkerProcess], kind: str, index: int, root: Path,
          queue: str = "default") -> dict:
    directory = root / f"{kind}-{index}-{queue}"
    counted_in(directory)
    spec = counting(SPEC, directory)
    spec["resources"] = {"queue": queue}
    if kind == "crash-1":
        spec["checkpoint"] = {**spec["checkpoint"], "memory_every_steps": 1}
    job = client.submit(spec, f"{kind.lower()}-{index}-{int(time.time())}")
    status = poll(lambda: (s := job.status()).state.value == "running" and (s.step or 0) >= 30 and s.pid and s)
    holder = next(w for w in workers if w.name == status.worker)
    dead = status.pid
    at = time.time()
    if kind.startswith("crash"):
        os.kill(dead, signal.SIGKILL)
    else:
        holder.signal(signal.SIGKILL if kind == "node" else signal.SIGTERM, group=kind == "node")
    back = poll(lambda: min((t for pid, times in forwards(directory).items() if pid != dead for t in times if t > at),
                            default=None))
    resumed = poll(lambda: (s := job.status()).attempt >= 2 and s.resumed_from is not None and s)
    trained = len(forwards(directory)[dead])
    job.cancel()
    if not kind.startswith("crash"):
        holder.proc.wait(timeout=120)
    source = "memory" if re.search(r"resumed in memory", resumed.last_event or "") else "checkpoint"
    return {"fault": kind, "trial": index, "queue": queue, "back_s": back - at, "trained_by_dead": trained,
            "resumed_from": resumed.resumed_from, "redone": trained - resumed.resumed_from, "source": source,
            "same_worker": resumed.worker == holder.name}


def in_process_cost(spec: dict, repeats: int, root: Path, modes: tuple = ("off", "auto")) -> dict:
    """Seconds per optimizer step of the loop with in-memory copies (``modes``: auto, 1) and without,
    interleaved."""
    from baton.schemas.spec import JobSpec
    from baton.storage.stores.file_store import FileStore
    from baton.storage.layout import JobPaths
    from baton.workers.attempt.local import register_spec
    from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt
    from baton.workers.training.control import LoopControl

    class Quiet(LoopControl):
        def __init__(self) -> None:
            self.lines: list[str] = []

        def log(self, message: str) -> None:
            self.lines.append(message)

    times: dict = {mode: [] for mode in modes}
    said: dict = {}
    for r in range(repeats):
        for mode in modes:
            parsed = JobSpec.parse({**spec, "checkpoint": {**spec["checkpoint"], "memory_every_steps": mode}})
            store = FileStore(root / f"store-{mode}-{r}")
            job = f"{mode}-{r}"
            register_spec(store, JobPaths(job), parsed)
            dirs = [root / f"memory-{mode}-{r}"]
            dirs[0].mkdir(parents=True)
            control = Quiet()
            started = time.perf_counter()
            result = run_attempt(Attempt(parsed, job, 1, store), AttemptOptions(control, memory=tuple([str(d) for d in dirs])))
            times[mode].append((time.perf_counter() - started) / result.outcome.step)
            said[mode] = next((line for line in control.lines if line.startswith("in-memory copies:")), "")
    off = statistics.median(times["off"])
    return {str(mode): {"step_s": statistics.median(times[mode]), "ratio": statistics.median(times[mode]) / off,
                        "copier": said[mode]} for mode in modes}


def worker_cost(client: JobClient, repeats: int, queue: str) -> dict:
    """The training time of one job (its metrics rows' epoch_s) with copies (auto) and without, on one
    worker of ``queue``, interleaved."""
    spec = {**SPEC, "loop": {"epochs": 4}, "resources": {"queue": queue}}
    times: dict[str, list[float]] = {"auto": [], "off": []}
    for r in range(repeats):
        for mode in ("off", "auto"):
            job = client.submit({**spec, "checkpoint": {**spec["checkpoint"], "memory_every_steps": mode}},
                                f"cost-{mode}-{r}-{int(time.time())}")
            final = job.wait(timeout=600, progress=False)
            assert final.state.value == "succeeded", final.error
            times[mode].append(sum(row["epoch_s"] for row in job.metrics()))
    off, auto = statistics.median(times["off"]), statistics.median(times["auto"])
    return {"train_s_off": off, "train_s_auto": auto, "ratio": auto / off}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--cost-repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results/recovery.json")
    parser.add_argument("--faults", default=",".join(FAULTS), help="which faults, of " + ", ".join(FAULTS))
    parser.add_argument("--job-users", default="", help="worker,own: each trial under both, alternated (module doc)")
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    assert set(faults) <= set(FAULTS), f"--faults: of {', '.join(FAULTS)}"
    users = [u for u in args.job_users.split(",") if u]
    assert set(users) <= set(JOB_USERS), "--job-users: of worker, own"
    queues = {f"as-{u}": JOB_USERS[u] for u in users} or {"default": None}

    settings = BatonSettings()
    root = Path(tempfile.mkdtemp(prefix="baton-recovery-"))
    redis, s3 = RedisServer().start(), S3Server().start()
    s3.create_bucket("recovery")
    env = {**os.environ, **s3.env(), "BATON_REDIS_URL": redis.url, "BATON_STORAGE_URL": "s3://recovery/bench",
           "BATON_ALLOWED_MODULES": "bench", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                                      os.environ.get("PYTHONPATH")]))}
    os.environ.update(env)
    client = JobClient()
    pairs: dict[str, list[WorkerProcess]] = {queue: [] for queue in queues}
    names = iter(range(1000))
    rows = []
    through_worker: dict = {}
    try:
        for kind in faults:
            for index in range(args.trials):
                for queue, job_user in queues.items():
                    pair = pairs[queue] = [w for w in pairs[queue] if w.proc.poll() is None]
                    while len(pair) < 2:
                        n = next(names)
                        wenv = env if job_user is None else {**env, "BATON_JOB_USER": job_user}
                        pair.append(WorkerProcess(f"bench-{n}@local", wenv, str(root / f"w{n}.log"),
                                                  queues=queue).start().wait_ready())
                    row = trial(client, pair, kind, index, root, queue)
                    rows.append(row)
                    print(f"  {kind} trial {index} ({queue}): training again after {row['back_s']:.2f}s, {row['redone']} "
                          f"step(s) redone (from {row['source']})", flush=True)
        if args.cost_repeats:
            print("cost through a worker ...", flush=True)
            through_worker = {queue: worker_cost(client, args.cost_repeats, queue) for queue in queues}
    finally:
        stop_workers([w for pair in pairs.values() for w in pair])
        redis.stop()
        s3.stop()
    in_process: dict = {}
    if args.cost_repeats:
        print("cost in one process ...", flush=True)
        in_process = {"small": in_process_cost({**SPEC, "loop": {"epochs": 2}}, args.cost_repeats, root / "small",
                                               ("off", "auto", 1)),
                      "25M": in_process_cost(LARGE, args.cost_repeats, root / "large")}

    print(f"\nrecovery, {args.trials} trials each (lease TTL {settings.lease_ttl_s:g}s, heartbeat {settings.heartbeat_s:g}s, "
          f"reaper every {settings.reaper_period_s:g}s; {os.cpu_count()} cores)")
    print(f"{'fault':>8} {'queue':>9} {'trial':>5} {'back s':>7} {'trained':>8} {'resumed from':>13} {'redone':>7} "
          f"{'source':>11} {'same worker':>12}")
    for r in rows:
        print(f"{r['fault']:>8} {r['queue']:>9} {r['trial']:>5} {r['back_s']:>7.2f} {r['trained_by_dead']:>8} "
              f"{r['resumed_from']:>13} {r['redone']:>7} {r['source']:>11} {str(r['same_worker']):>12}")
    summary = {}
    for kind in faults:
        for queue in queues:
            mine = [r for r in rows if r["fault"] == kind and r["queue"] == queue]
            name = kind if len(queues) == 1 else f"{kind} {queue}"
            summary[name] = {"back_s_median": statistics.median(r["back_s"] for r in mine),
                             "back_s_max": max(r["back_s"] for r in mine), "redone_max": max(r["redone"] for r in mine)}
            print(f"{name}: training again in {summary[name]['back_s_median']:.3f}s median, "
                  f"{summary[name]['back_s_max']:.3f}s max; at most {summary[name]['redone_max']} step(s) redone")
    print("\nin-memory copies (checkpoint.memory_every_steps against off), medians:")
    for name, cost in in_process.items():
        for mode, row in cost.items():
            print(f"  one process, {name} model, {mode}: {row['step_s'] * 1e3:.2f} ms a step ({row['ratio']:.3f}x); "
                  f"{row['copier']}")
    for queue, cost in through_worker.items():
        print(f"  through a worker ({queue}): {cost['train_s_auto']:.2f} against {cost['train_s_off']:.2f} s of "
              f"training ({cost['ratio']:.3f}x)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                               "settings": {"lease_ttl_s": settings.lease_ttl_s, "heartbeat_s": settings.heartbeat_s,
                                            "reaper_period_s": settings.reaper_period_s},
                               "trials": rows, "summary": summary,
                               "copy_cost": {"in_process": in_process, "through_worker": through_worker}}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
