"""How fast a multi-node job starts, and comes back after losing a node.

Real redis-server, S3 endpoint (moto) and three `baton worker` processes on this machine, each
standing for a node (distinct by name; loopback rendezvous). Side by side in one run:

- **admission**: from submit to the first optimizer step, for a job on 2 nodes of 1 rank (its gang
  forms, the leader claims the attempt and serves the rendezvous, the follower starts its rank) and
  for the same 2 ranks on one node (a plain claim);
- **node loss**: from SIGKILL of the follower's worker (its whole process group: the node is gone)
  to the first step the next gang trains after resuming, and the steps it redoes. The third worker
  is the spare the new gang forms with.

    python bench/multinode.py [--trials 3] [--out bench/results/multinode.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from baton.jobs.client import JobClient  # noqa: E402
from baton.jobs.services import RedisServer, S3Server, WorkerProcess, stop_workers  # noqa: E402
from baton.schemas.settings import BatonSettings  # noqa: E402
from bench import recovery  # noqa: E402
from bench.recovery import poll  # noqa: E402

# bench/recovery.py's job (an MLP on the spiral, a checkpoint every 20 steps) on 2 nodes of 1 sharded rank
SPEC = {**recovery.SPEC, "name": "multinode",
        "resources": {"device": "cpu", "cpu_threads": 1, "strategy": "fsdp", "processes": 1, "nodes": 2}}
ONE_NODE = {**SPEC, "resources": {**SPEC["resources"], "processes": 2, "nodes": 1}}
NODE_ENV = {"BATON_GANG_DISTINCT": "worker", "BATON_NODE_ADDRESS": "127.0.0.1"}


def admission(client: JobClient, spec: dict, name: str) -> tuple[object, float]:
    started = time.monotonic()
    job = client.submit(spec, name)
    poll(lambda: (s := job.status()).state.value == "running" and (s.step or 0) >= 1)
    return job, time.monotonic() - started


def gang_follower(client: JobClient, job_id: str) -> str:
    from baton.storage.records.gangs import Gangs

    return poll(lambda: (g := Gangs(client.records.redis).read(job_id)) and g.state == "running" and g.workers[1])


def trial(client: JobClient, workers: list[WorkerProcess], index: int) -> dict:
    stamp = int(time.time())
    single, single_s = admission(client, ONE_NODE, f"one-node-{index}-{stamp}")
    single.cancel()
    poll(lambda: single.status().state.terminal)
    job, gang_s = admission(client, SPEC, f"two-nodes-{index}-{stamp}")
    poll(lambda: (job.status().step or 0) >= 30)
    follower = next(w for w in workers if w.name == gang_follower(client, job.id))
    step_at_kill = job.status().step
    killed = time.monotonic()
    follower.signal(signal.SIGKILL, group=True)
    resumed = poll(lambda: (s := job.status()).attempt >= 2 and s.resumed_from is not None
                   and (s.step or 0) > s.resumed_from and s)
    back_s = time.monotonic() - killed
    job.cancel()
    poll(lambda: job.status().state.terminal)
    return {"trial": index, "one_node_admission_s": single_s, "two_node_admission_s": gang_s, "node_loss_s": back_s,
            "step_at_kill": step_at_kill, "resumed_from": resumed.resumed_from,
            "steps_lost": max(0, step_at_kill - resumed.resumed_from)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--out", default="bench/results/multinode.json")
    args = parser.parse_args()

    settings = BatonSettings()
    logs = Path(tempfile.mkdtemp(prefix="baton-multinode-"))
    redis, s3 = RedisServer().start(), S3Server().start()
    s3.create_bucket("multinode")
    env = {**os.environ, **s3.env(), **NODE_ENV, "BATON_REDIS_URL": redis.url,
           "BATON_STORAGE_URL": "s3://multinode/bench"}
    os.environ.update(env)
    client = JobClient()
    workers: list[WorkerProcess] = []
    names = iter(range(1000))
    rows = []
    try:
        for index in range(args.trials):
            workers = [w for w in workers if w.proc.poll() is None]
            while len(workers) < 3:
                n = next(names)
                workers.append(WorkerProcess(f"bench-{n}@local", env, str(logs / f"w{n}.log")).start().wait_ready())
            time.sleep(1.0)  # idle workers: every one waiting on the queue
            row = trial(client, workers, index)
            rows.append(row)
            print(f"  trial {index}: admitted in {row['two_node_admission_s']:.2f}s (one node: "
                  f"{row['one_node_admission_s']:.2f}s); back {row['node_loss_s']:.2f}s after a node loss, "
                  f"{row['steps_lost']} steps redone", flush=True)
    finally:
        stop_workers(workers)
        redis.stop()
        s3.stop()

    print(f"\nmulti-node, {args.trials} trials (2 nodes x 1 rank, gloo; lease TTL {settings.lease_ttl_s:g}s, "
          f"heartbeat {settings.heartbeat_s:g}s, reaper every {settings.reaper_period_s:g}s; {os.cpu_count()} cores)")
    print(f"{'trial':>5} {'1 node: submit->step s':>23} {'2 nodes: submit->step s':>24} {'node loss->step s':>18} "
          f"{'redone':>7}")
    for r in rows:
        print(f"{r['trial']:>5} {r['one_node_admission_s']:>23.2f} {r['two_node_admission_s']:>24.2f} "
              f"{r['node_loss_s']:>18.2f} {r['steps_lost']:>7}")
    summary = {key: {"median": statistics.median(r[key] for r in rows), "max": max(r[key] for r in rows)}
               for key in ("one_node_admission_s", "two_node_admission_s", "node_loss_s", "steps_lost")}
    print(f"admission: {summary['two_node_admission_s']['median']:.2f}s median on 2 nodes against "
          f"{summary['one_node_admission_s']['median']:.2f}s on one; back after a node loss in "
          f"{summary['node_loss_s']['median']:.2f}s median, {summary['node_loss_s']['max']:.2f}s max")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                               "settings": {"lease_ttl_s": settings.lease_ttl_s, "heartbeat_s": settings.heartbeat_s,
                                            "reaper_period_s": settings.reaper_period_s},
                               "trials": rows, "summary": summary}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
