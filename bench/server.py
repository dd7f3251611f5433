"""What the pool's server costs a user: ``--jobs`` job records in a real redis-server (bench/ui.py's history:
three teams, two queues, most jobs finished; their specs in moto's S3 server, or ``--store file``), a real ``baton server`` (every request's token looked up in
Redis, its role checked, every action audited) and, beside it on the same Redis and store, a real
``baton ui`` (one person's dashboard: no tokens), measured in one run, interleaved:

- **status** (``GET /api/jobs/ID/status``, a random job of the member's team: what ``baton status`` reads
  through the server), **job** (``GET /api/jobs/ID``, the job page's read) and **list** (``GET /api/jobs``,
  the jobs page's own queries): p50, p95 and max over ``--requests`` requests, for a member (who reads only
  their team's jobs: the listing is filtered) and an admin, through the server; job and list through
  ``baton ui`` (it has no status route);
- **submit**: ``JobClient.submit`` of the same spec, direct (the client writes Redis and the store itself)
  and through the server (``BATON_SERVER_URL``: one request; the server validates, checks the role and the
  team's limit, writes, audits), ``--submits`` each, alternating; the ratio of their medians.

    python bench/server.py [--jobs 10000] [--requests 200] [--submits 40] [--store s3|file] [--out bench/results/server.json]

``--jobs 300 --requests 20 --submits 4`` is a CI-sized case (tests/bench).
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable

import redis as redis_lib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from baton.jobs.client import JobClient  # noqa: E402
from baton.jobs.server_client import ServerClient  # noqa: E402
from baton.jobs.services import RedisServer, S3Server  # noqa: E402
from baton.schemas.errors import LocalStoreWarning  # noqa: E402
from baton.schemas.principals import Principal, Role  # noqa: E402
from baton.schemas.settings import BatonSettings  # noqa: E402
from baton.storage.records.job_records import JobRecords  # noqa: E402
from baton.storage.records.principals import Principals  # noqa: E402
from bench.loop_overhead import write_result  # noqa: E402
from bench.ui import QUERIES, SPEC, free_port, make_history, percentiles, serve  # noqa: E402

SUBMITTED = {**SPEC, "resources": {"team": "vision", "queue": "nobody-serves"}}


def timed(request: Callable[[int], object], count: int) -> list[float]:
    times = []
    for i in range(count):
        started = time.perf_counter()
        request(i)
        times.append((time.perf_counter() - started) * 1000)
    return times


def getter(url: str, token: str = "") -> Callable[[str], bytes]:
    """GET over one kept-alive connection, as a browser and ``ServerClient`` read."""
    import urllib3

    connections = urllib3.PoolManager(retries=False, headers={"Authorization": f"Bearer {token}"} if token else {})

    def get(path: str) -> bytes:
        response = connections.request("GET", url + path, timeout=60)
        assert response.status == 200, (path, response.status, response.data[:200])
        return response.data
    return get


def measure_reads(urls: dict[str, Callable[[str], bytes]], ids: list[str], requests: int) -> dict[str, dict]:
    """Each reader's times for a job's status (the server's clients' read; ``baton ui`` has none), a job
    (the job page's read) and a list, the readers taking turns request by request (a neighbour's load falls
    on all of them alike)."""
    rng, times = random.Random(2), {name: {"status": [], "job": [], "list": []} for name in urls}
    for i in range(requests):
        job_id, query = rng.choice(ids), QUERIES[i % len(QUERIES)]
        for name, get in urls.items():
            if name.startswith("server"):
                times[name]["status"] += timed(lambda _: get(f"/api/jobs/{job_id}/status"), 1)
            times[name]["job"] += timed(lambda _: get(f"/api/jobs/{job_id}"), 1)
            times[name]["list"] += timed(lambda _: get(f"/api/jobs?{query}"), 1)
    return {name: {kind: percentiles(values) for kind, values in kinds.items() if values} for name, kinds in times.items()}


def measure_submits(direct: JobClient, server: ServerClient, count: int) -> dict[str, dict]:
    times: dict[str, list[float]] = {"direct": [], "server": []}
    for i in range(count):
        for name, client in (("direct", direct), ("server", server)):
            times[name] += timed(lambda _: client.submit(SUBMITTED, f"{name}-{i:04d}"), 1)
    return {name: percentiles(values) for name, values in times.items()}


def run(args: argparse.Namespace, redis: RedisServer, store_url: str) -> tuple[dict, dict]:
    """The history, the two servers, and their figures (the servers stopped before the store goes)."""
    records = JobRecords(redis_lib.Redis.from_url(redis.url, decode_responses=True))
    make_history(records, store_url, args.jobs, 0)
    principals = Principals(records.redis)
    member = principals.add(Principal(name="ada", role=Role.member, teams=("vision",)))
    admin = principals.add(Principal(name="root", role=Role.admin))
    vision = [job_id for job_id in records.list_ids(args.jobs) if records.raw(job_id).get("team") == "vision"]
    env = {**os.environ, "BATON_REDIS_URL": redis.url, "BATON_STORAGE_URL": store_url,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for name in ("BATON_UI_TOKEN", "BATON_SERVER_URL", "BATON_TOKEN"):
        env.pop(name, None)
    ports, procs = {"server": free_port(), "ui": free_port()}, []
    try:
        procs = [serve(env, port, command, 30) for command, port in ports.items()]
        server_url, ui_url = (f"http://127.0.0.1:{ports[name]}" for name in ("server", "ui"))
        reads = measure_reads({"server, member": getter(server_url, member), "server, admin": getter(server_url, admin),
                               "ui, no token": getter(ui_url)}, vision, args.requests)
        through = ServerClient(BatonSettings.model_validate({"server_url": server_url, "token": member}))
        submits = measure_submits(JobClient(redis.url, store_url), through, args.submits)
    finally:
        for proc in procs:
            os.killpg(proc.pid, 15)
            proc.wait()
    return reads, submits


def main() -> None:
    warnings.simplefilter("ignore", LocalStoreWarning)  # (the bench's store is a directory of this machine, on purpose)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--submits", type=int, default=40)
    parser.add_argument("--store", choices=("s3", "file"), default="s3",
                        help="The pool's store: moto's S3 server (as a pool runs) or a directory")
    parser.add_argument("--out", default="bench/results/server.json")
    args = parser.parse_args()
    redis, s3 = RedisServer().start(), S3Server().start() if args.store == "s3" else None
    try:
        with tempfile.TemporaryDirectory(prefix="baton-server-bench-") as tmp:
            if s3 is not None:
                s3.create_bucket("bench")
                os.environ.update(s3.env())  # (this process's clients, and the servers it starts)
            reads, submits = run(args, redis, "s3://bench/jobs" if s3 is not None else f"file://{tmp}/store")
    finally:
        redis.stop()
        if s3 is not None:
            s3.stop()
    ratio = round(submits["server"]["p50_ms"] / submits["direct"]["p50_ms"], 2)
    result = {"jobs": args.jobs, "store": args.store, "requests": args.requests, "submits": args.submits, "reads": reads,
              "submit": submits, "submit_ratio_p50": ratio}
    print(f"{'what':46} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
    for name, kinds in reads.items():
        for kind, figures in kinds.items():
            what = f"{kind} ({name}, {args.jobs} jobs)"
            print(f"{what:46} {figures['p50_ms']:8} {figures['p95_ms']:8} {figures['max_ms']:8}")
    for name, figures in submits.items():
        print(f"{f'submit ({name})':46} {figures['p50_ms']:8} {figures['p95_ms']:8} {figures['max_ms']:8}")
    print(f"submit through the server / direct (p50): {ratio}x")
    write_result(result, args.out)


if __name__ == "__main__":
    main()
