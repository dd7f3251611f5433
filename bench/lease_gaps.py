"""How late a worker's lease renewals come on a loaded machine, and so how short the lease can be.

A redis-server, an S3 endpoint (moto) and one `baton worker` training a job, with the machine loaded
by N busy processes besides. Redis's MONITOR stream stamps every renewal of the job's lease with the
server's own clock (this process's scheduling does not blur it); the gap between two renewals is how
long the lease went unrenewed, and a gap longer than the lease's TTL would lose the job to the reaper
although its worker lives (a false loss). Reported per load: the renewal gaps (median, p99, max)
against the heartbeat period, and the least TTL that the largest gap leaves room for.

    python bench/lease_gaps.py [--seconds 60] [--loads 0,2,4,8] [--heartbeat 0.5] [--ttl 3]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis as redis_lib  # noqa: E402

from baton.storage.records import keys  # noqa: E402
from baton.jobs.client import JobClient  # noqa: E402
from baton.jobs.services import RedisServer, S3Server, WorkerProcess  # noqa: E402
from bench.recovery import SPEC, poll  # noqa: E402


def burn(stop_at: float) -> None:
    while time.time() < stop_at:
        sum(range(10000))


def renewals(url: str, lease_key: str, seconds: float) -> list[float]:
    """The server's timestamps of the renewals of ``lease_key`` over ``seconds``."""
    stamps: list[float] = []
    client = redis_lib.Redis.from_url(url)
    deadline = time.monotonic() + seconds
    with client.monitor() as monitor:
        for command in monitor.listen():
            parts = command["command"].split()
            # the heartbeat's script: KEYS lease, job, worker-stopping (fenced writes name the job first)
            if len(parts) > 3 and parts[0].upper() in ("EVALSHA", "EVAL") and parts[2] == "3" and parts[3] == lease_key:
                stamps.append(float(command["time"]))
            if time.monotonic() > deadline:
                break
    return stamps


def measure(client: JobClient, redis_url: str, load: int, seconds: float, heartbeat_s: float) -> dict:
    job = client.submit({**SPEC, "loop": {"epochs": 1000}}, f"gaps-{load}-{int(time.time())}")
    poll(lambda: (s := job.status()).state.value == "running" and (s.step or 0) >= 5)
    stop_at = time.time() + seconds + 5
    burners = [multiprocessing.Process(target=burn, args=(stop_at,), daemon=True) for _ in range(load)]
    for b in burners:
        b.start()
    time.sleep(2)  # the load settles
    stamps = renewals(redis_url, keys.lease(job.id), seconds)
    for b in burners:
        b.terminate()
    status = job.status()
    job.cancel()
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"load": load, "renewals": len(stamps), "gap_median_s": statistics.median(gaps),
            "gap_p99_s": sorted(gaps)[max(0, int(len(gaps) * 0.99) - 1)], "gap_max_s": max(gaps),
            "heartbeat_s": heartbeat_s, "lost": status.lost, "state": status.state.value, "load_avg": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--loads", default="0,2,4,8", help="busy processes besides the worker, per run")
    parser.add_argument("--heartbeat", type=float, default=None, help="BATON_HEARTBEAT_S for the worker")
    parser.add_argument("--ttl", type=float, default=None, help="BATON_LEASE_TTL_S for the worker")
    parser.add_argument("--out", default="bench/results/lease_gaps.json")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="baton-lease-gaps-"))
    redis, s3 = RedisServer().start(), S3Server().start()
    s3.create_bucket("gaps")
    env = {**os.environ, **s3.env(), "BATON_REDIS_URL": redis.url, "BATON_STORAGE_URL": "s3://gaps/bench"}
    if args.heartbeat is not None:
        env["BATON_HEARTBEAT_S"] = str(args.heartbeat)
    if args.ttl is not None:
        env["BATON_LEASE_TTL_S"] = str(args.ttl)
    os.environ.update(env)
    from baton.schemas.settings import BatonSettings

    settings = BatonSettings()
    client = JobClient()
    worker = WorkerProcess("gaps@local", env, str(root / "worker.log")).start().wait_ready()
    rows = []
    try:
        for load in [int(n) for n in args.loads.split(",")]:
            row = measure(client, redis.url, load, args.seconds, settings.heartbeat_s)
            rows.append(row)
            print(f"  load {load}: {row['renewals']} renewals, gaps median {row['gap_median_s']:.3f}s, p99 "
                  f"{row['gap_p99_s']:.3f}s, max {row['gap_max_s']:.3f}s (load average {row['load_avg']:.1f}); "
                  f"lost {row['lost']}", flush=True)
    finally:
        worker.stop()
        redis.stop()
        s3.stop()

    print(f"\nlease renewals under load ({os.cpu_count()} cores; heartbeat {settings.heartbeat_s:g}s, "
          f"lease TTL {settings.lease_ttl_s:g}s; {args.seconds:g}s each)")
    print(f"{'busy procs':>10} {'load avg':>9} {'renewals':>9} {'median s':>9} {'p99 s':>7} {'max s':>7} {'lost':>5}")
    for r in rows:
        print(f"{r['load']:>10} {r['load_avg']:>9.1f} {r['renewals']:>9} {r['gap_median_s']:>9.3f} {r['gap_p99_s']:>7.3f} "
              f"{r['gap_max_s']:>7.3f} {r['lost']:>5}")
    worst = max(r["gap_max_s"] for r in rows)
    print(f"largest gap {worst:.3f}s: the lease's TTL ({settings.lease_ttl_s:g}s) leaves "
          f"{settings.lease_ttl_s - worst:.2f}s to spare")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                               "settings": {"lease_ttl_s": settings.lease_ttl_s, "heartbeat_s": settings.heartbeat_s},
                               "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
