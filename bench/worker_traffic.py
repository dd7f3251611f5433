"""What one real ``baton worker`` costs Redis, idle and running a fast job, counted by Redis itself.

A fresh redis-server, the file store, one real worker (Celery consumer, reaper, presence, heartbeat):
``INFO commandstats`` over ``--seconds`` while the worker is idle, then again while it trains a job
of a small MLP at several hundred steps a second (examples/spiral.yaml, checkpoints every 20 steps,
validation every epoch: a job whose progress, commits and validations come many times a second). The
running figure less the idle one is what a running job costs: its renewals, and a fence per commit.

    python bench/worker_traffic.py [--seconds 20]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from baton.jobs.services import RedisServer, WorkerProcess  # noqa: E402
from bench.loop_overhead import write_result  # noqa: E402


def counted(client: redis.Redis, seconds: float) -> dict[str, float]:
    """Commands a second by name over ``seconds``, as Redis counts them (those scripts make included)."""
    def calls() -> dict[str, int]:
        return {k[len("cmdstat_"):]: int(v["calls"]) for k, v in client.info("commandstats").items()}
    before = calls()
    time.sleep(seconds)
    after = calls()
    return {k: (after[k] - before.get(k, 0)) / seconds for k in after if after[k] != before.get(k, 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", default="bench/results/worker_traffic.json")
    args = parser.parse_args()
    from baton.jobs.client import JobClient

    server = RedisServer().start()
    work = Path(tempfile.mkdtemp(prefix="baton-traffic-"))
    env = {**os.environ, "BATON_REDIS_URL": server.url, "BATON_STORAGE_URL": f"file://{work / 'store'}",
           "BATON_METRICS_PORT": "0", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    worker = WorkerProcess("traffic@bench", env, str(work / "worker.log"), "default").start().wait_ready()
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        time.sleep(3)
        idle = counted(client, args.seconds)
        jobs = JobClient(redis_url=server.url, storage_url=f"file://{work / 'store'}")
        job = jobs.submit(str(ROOT / "examples" / "spiral.yaml"), overrides=["loop.epochs=100000", "checkpoint.every_steps=20"])
        while job.status().state.value != "running" or not job.status().step:
            time.sleep(0.2)
        time.sleep(3)
        first, began = job.status().step, time.time()
        running = counted(client, args.seconds)
        steps_per_s = (job.status().step - first) / (args.seconds + 0.0)
        window = (began, time.time())
        job.cancel()
        while job.status().state.value != "cancelled":
            time.sleep(0.2)
        validations = validations_in(work / "store", job.id, window)
    finally:
        worker.stop()
        server.stop()
    job_cost = {k: running.get(k, 0.0) - idle.get(k, 0.0) for k in set(running) | set(idle)}
    result = {"seconds": args.seconds, "idle_worker_per_s": sum(idle.values()), "running_per_s": sum(running.values()),
              "job_per_s": sum(job_cost.values()), "steps_per_s": steps_per_s, "validations": validations,
              "idle_by_command": dict(sorted(idle.items(), key=lambda kv: -kv[1])),
              "job_by_command": dict(sorted(((k, v) for k, v in job_cost.items() if abs(v) >= 0.05), key=lambda kv: -kv[1]))}
    print(f"idle worker: {result['idle_worker_per_s']:.1f} commands/s "
          f"({', '.join(f'{k} {v:.1f}' for k, v in list(result['idle_by_command'].items())[:6])})")
    print(f"a running job, {steps_per_s:.0f} steps/s: {result['job_per_s']:.1f} commands/s more "
          f"({', '.join(f'{k} {v:.1f}' for k, v in list(result['job_by_command'].items())[:8])})")
    print(f"  in the window, a second: {validations['per_s']:.1f} validations, {validations['checkpointed_per_s']:.1f} "
          f"of them checkpointed, {validations['new_bests_per_s']:.1f} new bests")
    write_result(result, args.out)


def validations_in(store_root: Path, job_id: str, window: tuple[float, float]) -> dict[str, float]:
    """The job's validations within ``window`` (its metrics rows), a second: all, those checkpointed, new bests."""
    from baton.storage.artifacts import read_metrics
    from baton.storage.layout import JobPaths
    from baton.storage.manifest_store import ManifestStore
    from baton.storage.stores.file_store import FileStore

    store = FileStore(store_root)
    rows = [row for row in read_metrics(store, ManifestStore(store, JobPaths(job_id)).read())
            if window[0] <= row["time"] <= window[1]]
    seconds = window[1] - window[0]
    return {"per_s": len(rows) / seconds, "checkpointed_per_s": sum(1 for r in rows if r["checkpoint"]) / seconds,
            "new_bests_per_s": sum(1 for r in rows if r["is_best"]) / seconds}


if __name__ == "__main__":
    main()
