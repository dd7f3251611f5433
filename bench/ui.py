"""What the dashboard costs with a team's history behind it: ``--jobs`` job records in a real
redis-server (and each job's spec in the store, plus ``--store-only`` jobs that only the store holds),
and one job whose metrics hold ``--rows`` validation rows.

Measured in one run, on this machine, against a real ``baton ui`` process and Debian's headless Chromium:

- **jobs API ms**: ``GET /api/jobs`` answered, over ``--requests`` requests of the jobs page's own kinds
  (the first page, a state filter, a name search, a sort by best value, a deep page): p50 and p95;
  beside it, ``JobClient.list(limit=50)`` (the Python surface's listing, which reads one record at a time)
  timed the same way;
- **job page ms**: a job page with ``--rows`` metric rows (whole rows, as a worker writes them), from
  navigation start until its charts are drawn, by the browser's own clock (``performance.now()`` when
  the page has drawn them): the first load (the server reads the rows from the store) and the next ones
  (kept while the job's metrics object is the same). The page draws at most 10,000 rows at first (an
  even sample, and the last row); ``?rows=all`` draws every row, timed the same way.

    python bench/ui.py [--jobs 10000] [--rows 100000] [--out bench/results/ui.json]

``--jobs 500 --rows 5000 --requests 40 --loads 2`` is a CI-sized case (tests/bench).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import redis as redis_lib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from baton.jobs.client import JobClient  # noqa: E402
from baton.jobs.services import RedisServer  # noqa: E402
from baton.schemas.manifest import CheckpointManifest, MetricsRef  # noqa: E402
from baton.schemas.metrics import MetricsRow  # noqa: E402
from baton.schemas.spec import JobSpec  # noqa: E402
from baton.storage.checkpoint_io import sha256_of  # noqa: E402
from baton.storage.layout import JobPaths  # noqa: E402
from baton.storage.records.job_records import JobRecords, spec_fields  # noqa: E402
from baton.storage.stores.open import open_store  # noqa: E402
from bench.loop_overhead import write_result  # noqa: E402

SPEC = {"name": "bench", "model": {"target": "builtin:mlp", "kwargs": {"in_features": 2, "out_features": 3}},
        "data": {"target": "builtin:spiral"}, "optimizer": {"name": "adamw", "lr": 1e-3}, "loop": {"epochs": 1}}
STATES = ("succeeded",) * 80 + ("failed",) * 10 + ("cancelled",) * 7 + ("running",) + ("queued",) * 2
"""A history: most jobs finished; 3 % running or waiting (300 of 10,000: a busy pool's queue)."""
QUERIES = ("", "state=running", "name=bench-0042", "sort=best_value&order=asc", "offset=5000", "team=vision")


def make_history(records: JobRecords, store_url: str, jobs: int, store_only: int) -> None:
    store, rng = open_store(store_url), random.Random(0)
    spec = JobSpec.model_validate(SPEC)
    fields = spec_fields(spec, store_url)
    pipe = records.redis.pipeline(transaction=False)
    for i in range(jobs):
        job_id = f"bench-{i:05d}"
        records.create(job_id, {**fields, "team": rng.choice(("vision", "speech", "ranking")),
                                "queue": rng.choice(("default", "a100"))})
        state = rng.choice(STATES)
        if state != "queued":
            pipe.hset(f"baton:job:{job_id}", mapping={"state": state, "step": rng.randrange(1, 10_000),
                                                       "best_value": rng.random(), "attempt": 1})
        if state in ("succeeded", "failed", "cancelled"):  # as a finished job's record is
            pipe.srem("baton:active", job_id)
        store.put_bytes(JobPaths(job_id).spec, spec.model_dump_json().encode())
    pipe.execute()
    for i in range(store_only):
        store.put_bytes(JobPaths(f"ran-{i:04d}").spec, spec.model_dump_json().encode())


def make_metrics(records: JobRecords, store_url: str, rows: int) -> str:
    """A finished job whose metrics object holds ``rows`` rows (each with one point of its training curve)."""
    store, job_id, rng = open_store(store_url), "big-metrics", random.Random(1)
    paths = JobPaths(job_id)
    lines = []
    for step in range(1, rows + 1):  # each a whole row, as a worker writes it
        loss = 2.0 / (1 + step / 1000) + rng.random() * 0.05
        lines.append(json.dumps(MetricsRow(
            epoch=step, step=step, train_loss=loss, train_curve=[(step, loss)], lr=1e-3 * (1 - step / (rows + 1)),
            grad_norm=1.0, grad_norm_max=2.0, samples_per_s=1000.0, epoch_s=0.5, time=1.8e9 + step,
            checkpoint=f"{paths.root}/attempt-1/checkpoints/step-{step}.pt", ckpt_count=1, ckpt_stall_s=0.01,
            ckpt_write_s=0.2, ckpt_bytes=123456, val_loss=loss * 1.1, val_accuracy=1 - loss / 3).model_dump()))
    data = ("\n".join(lines) + "\n").encode()
    key = f"{paths.root}/attempt-1/metrics/step-{rows}.jsonl"
    store.put_bytes(key, data)
    manifest = CheckpointManifest(job_id=job_id, attempt=1, metrics=MetricsRef(
        key=key, size=len(data), sha256=sha256_of(data), step=rows, attempt=1))
    store.put_bytes(paths.manifest, manifest.model_dump_json().encode())
    store.put_bytes(paths.spec, JobSpec.model_validate(SPEC).model_dump_json().encode())
    records.create(job_id, spec_fields(JobSpec.model_validate(SPEC), store_url))
    records.redis.hset(f"baton:job:{job_id}", mapping={"state": "succeeded", "step": rows, "attempt": 1})
    records.redis.srem("baton:active", job_id)
    return job_id


def percentiles(times_ms: list[float]) -> dict[str, float]:
    ordered = sorted(times_ms)
    return {"p50_ms": round(statistics.median(ordered), 1),
            "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 1),
            "max_ms": round(ordered[-1], 1)}


def time_api(url: str, requests: int) -> dict[str, float]:
    times = []
    for i in range(requests):
        query = QUERIES[i % len(QUERIES)]
        started = time.perf_counter()
        with urllib.request.urlopen(f"{url}/api/jobs?{query}", timeout=60) as response:
            json.loads(response.read())
        times.append((time.perf_counter() - started) * 1000)
    return percentiles(times)


def time_client_list(client: JobClient, requests: int) -> dict[str, float]:
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        client.list(limit=50)
        times.append((time.perf_counter() - started) * 1000)
    return percentiles(times)


def time_page(url: str, job_id: str, loads: int, query: str = "") -> list[float]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1500"):
        options.add_argument(argument)
    browser = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)
    drawn = []
    try:
        browser.get(f"{url}/")  # the browser's own start-up is not the page's: it opens the jobs page first
        time.sleep(1)
        for _ in range(loads):
            browser.get(f"{url}/jobs/{job_id}{query}")
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                at = browser.execute_script("return window.batonChartsDrawn || null")
                if at is not None:
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError("the page never drew its charts")
            points = int(browser.execute_script("return document.getElementById('loss').dataset.trainPoints"))
            marks = browser.execute_script("return performance.getEntriesByType('mark').map((m) => [m.name, m.startTime])")
            fetched = browser.execute_script("return performance.getEntriesByType('resource').filter((e) => e.name.includes('/metrics'))"
                                             ".map((e) => [e.startTime, e.responseStart, e.responseEnd])")
            print("  marks (ms since navigation):", {name: round(t) for name, t in marks},
                  "metrics request (start, first byte, last byte):", [[round(t) for t in f] for f in fetched][:1])
            drawn.append(round(float(at), 1))
            assert points > 0
    finally:
        browser.quit()
    return drawn


def serve(env: dict, port: int, command: str = "ui", history_every_s: float = 2) -> subprocess.Popen:
    """``baton ui`` (or ``baton server``) on ``port``, once it answers its health check."""
    proc = subprocess.Popen([sys.executable, "-m", "baton", command, "--port", str(port), "--history-every-s",
                             str(history_every_s)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=5).read()
            return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"baton {command} did not start")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--store-only", type=int, default=200)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--loads", type=int, default=3)
    parser.add_argument("--out", default="bench/results/ui.json")
    args = parser.parse_args()
    redis = RedisServer().start()
    proc = None
    try:
        with tempfile.TemporaryDirectory(prefix="baton-ui-bench-") as tmp:
            store_url = f"file://{tmp}/store"
            records = JobRecords(redis_lib.Redis.from_url(redis.url, decode_responses=True))
            started = time.perf_counter()
            make_history(records, store_url, args.jobs, args.store_only)
            job_id = make_metrics(records, store_url, args.rows)
            made_s = time.perf_counter() - started
            env = {**os.environ, "BATON_REDIS_URL": redis.url, "BATON_STORAGE_URL": store_url,
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
            env.pop("BATON_UI_TOKEN", None)
            port = free_port()
            proc = serve(env, port)
            url = f"http://127.0.0.1:{port}"
            listed, deadline = 0, time.monotonic() + 120  # the store-only jobs show once the store is listed
            while listed < args.jobs + 1 + args.store_only and time.monotonic() < deadline:
                listed = json.loads(urllib.request.urlopen(f"{url}/api/jobs?limit=1", timeout=60).read())["total"]
                time.sleep(0.2)
            api = time_api(url, args.requests)
            client = time_client_list(JobClient(redis.url, store_url), max(5, args.requests // 10))
            page = time_page(url, job_id, args.loads)
            page_all = time_page(url, job_id, args.loads, "?rows=all")
    finally:
        if proc is not None:
            os.killpg(proc.pid, 15)
            proc.wait()
        redis.stop()
    result = {"jobs": args.jobs, "store_only": args.store_only, "rows": args.rows, "listed": listed,
              "made_s": round(made_s, 1), "api": api, "client_list": client, "page_drawn_ms": page,
              "page_first_ms": page[0], "page_next_ms": max(page[1:]) if len(page) > 1 else None,
              "page_rows_drawn": min(args.rows, 10_000), "page_all_rows_drawn_ms": page_all}
    print(f"{'what':44} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
    print(f"{f'GET /api/jobs ({listed} jobs, page of 50)':44} {api['p50_ms']:8} {api['p95_ms']:8} {api['max_ms']:8}")
    print(f"{'JobClient.list(limit=50)':44} {client['p50_ms']:8} {client['p95_ms']:8} {client['max_ms']:8}")
    print(f"job page with {args.rows} rows drawn (browser clock): first {page[0]} ms, then {page[1:]} ms "
          f"(at most 10,000 rows sampled evenly); every row (?rows=all): {page_all} ms")
    write_result(result, args.out)


if __name__ == "__main__":
    main()
