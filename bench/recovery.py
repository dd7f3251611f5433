"""How fast a job comes back after its worker is lost, and how much training it loses.

Real redis-server, S3 endpoint (moto) and two `baton worker` processes on this machine. For each
trial a job is submitted; once it trains, the worker holding it gets SIGKILL (its whole process
group: the node is gone) or SIGTERM (a spot notice). Measured from the signal:

- claimed: another worker has claimed the job (a new attempt started),
- resumed: that worker has trained its first step after loading the checkpoint,
- steps lost: training steps done before the signal that the new attempt repeats
  (progress reaches Redis every 0.5 s, so up to 0.5 s of steps may go uncounted).

    python bench/recovery.py [--trials 3] [--out bench/results/recovery.json]
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
from baton.jobs.services import RedisServer, S3Server, WorkerProcess  # noqa: E402
from baton.schemas.settings import BatonSettings  # noqa: E402

SPEC = {
    "name": "recovery", "seed": 3,
    "model": {"target": "builtin:mlp", "kwargs": {"in_features": 2, "hidden": 256, "layers": 3, "out_features": 3}},
    "data": {"target": "builtin:spiral", "kwargs": {"n_per_class": 20000}, "batch_size": 256},
    "optimizer": {"name": "adamw", "lr": 1e-3},
    "loop": {"epochs": 50}, "checkpoint": {"every_steps": 20, "keep_last": 3},
}


def poll(fn, timeout_s: float = 120, every_s: float = 0.01):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(every_s)
    raise TimeoutError("gave up waiting")


def trial(client: JobClient, workers: list[WorkerProcess], kind: str, index: int) -> dict:
    job = client.submit(SPEC, f"{kind.lower()}-{index}-{int(time.time())}")
    poll(lambda: (s := job.status()).state.value == "running" and (s.step or 0) >= 30)
    status = job.status()
    holder = next(w for w in workers if w.name == status.worker)
    step_at_signal = status.step
    started = time.monotonic()
    holder.signal(signal.SIGKILL if kind == "SIGKILL" else signal.SIGTERM, group=kind == "SIGKILL")
    claimed = poll(lambda: job.status().attempt >= 2 and time.monotonic())
    resumed_status = poll(lambda: (s := job.status()).attempt >= 2 and s.resumed_from is not None
                          and (s.step or 0) > s.resumed_from and s)
    resumed = time.monotonic()
    job.cancel()
    holder.proc.wait(timeout=120)
    return {"kind": kind, "trial": index, "claimed_s": claimed - started, "resumed_s": resumed - started,
            "step_at_signal": step_at_signal, "resumed_from": resumed_status.resumed_from,
            "steps_lost": max(0, step_at_signal - resumed_status.resumed_from), "exit_code": holder.proc.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--out", default="bench/results/recovery.json")
    args = parser.parse_args()

    settings = BatonSettings()
    logs = Path(tempfile.mkdtemp(prefix="baton-recovery-"))
    redis, s3 = RedisServer().start(), S3Server().start()
    s3.create_bucket("recovery")
    env = {**os.environ, **s3.env(), "BATON_REDIS_URL": redis.url, "BATON_STORAGE_URL": "s3://recovery/bench"}
    os.environ.update(env)
    client = JobClient()
    workers: list[WorkerProcess] = []
    names = iter(range(1000))
    rows = []
    try:
        for kind in ("SIGKILL", "SIGTERM"):
            for index in range(args.trials):
                workers = [w for w in workers if w.proc.poll() is None]
                while len(workers) < 2:
                    n = next(names)
                    workers.append(WorkerProcess(f"bench-{n}@local", env, str(logs / f"w{n}.log")).start().wait_ready())
                row = trial(client, workers, kind, index)
                rows.append(row)
                print(f"  {kind} trial {index}: resumed after {row['resumed_s']:.2f}s, {row['steps_lost']} steps lost",
                      flush=True)
    finally:
        for worker in workers:
            worker.stop()
        redis.stop()
        s3.stop()

    print(f"\nrecovery, {args.trials} trials each (lease TTL {settings.lease_ttl_s:g}s, heartbeat {settings.heartbeat_s:g}s, "
          f"reaper every {settings.reaper_period_s:g}s; {os.cpu_count()} cores)")
    print(f"{'signal':>8} {'trial':>5} {'claimed s':>10} {'resumed s':>10} {'step@signal':>12} {'resumed from':>13} {'lost':>5}")
    for r in rows:
        print(f"{r['kind']:>8} {r['trial']:>5} {r['claimed_s']:>10.2f} {r['resumed_s']:>10.2f} {r['step_at_signal']:>12} "
              f"{r['resumed_from']:>13} {r['steps_lost']:>5}")
    summary = {}
    for kind in ("SIGKILL", "SIGTERM"):
        mine = [r for r in rows if r["kind"] == kind]
        summary[kind] = {"resumed_s_median": statistics.median(r["resumed_s"] for r in mine),
                         "resumed_s_max": max(r["resumed_s"] for r in mine),
                         "steps_lost_max": max(r["steps_lost"] for r in mine)}
        print(f"{kind}: resumed in {summary[kind]['resumed_s_median']:.2f}s median, {summary[kind]['resumed_s_max']:.2f}s max; "
              f"at most {summary[kind]['steps_lost_max']} steps lost")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                               "settings": {"lease_ttl_s": settings.lease_ttl_s, "heartbeat_s": settings.heartbeat_s,
                                            "reaper_period_s": settings.reaper_period_s},
                               "trials": rows, "summary": summary}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
