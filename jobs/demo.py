"""``baton demo``: a job that survives losing its worker, end to end, on this machine.

Starts a redis-server and an S3 endpoint (moto's server) on free loopback ports unless given
real ones, two ``baton worker`` processes, submits the spiral job, SIGKILLs the worker holding it
right after the job's first checkpoint, shows it resuming from there on the other worker, fetches the best model and the report, and checks
the result bit for bit against ``baton run`` of the same spec.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Optional

from baton.schemas.status import JobStatus
from baton.storage.checkpoint_io import load_bytes
from baton.storage.layout import JobPaths
from baton.storage.manifest_store import ManifestStore
from baton.storage.stores.open import open_store
from baton.storage.state_diff import count_tensors, first_difference

from baton.jobs.client import JobClient
from baton.jobs.display import progress_line
from baton.jobs.services import RedisServer, S3Server, WorkerProcess, die_with_parent, free_port, stop_workers

BUCKET = "baton-demo"
DEMO_SPEC = Path(__file__).with_name("demo_spiral.yaml")
"""The job the demo runs by default: examples/spiral.yaml, shipped inside the package."""
Say = Callable[[str], None]


def missing_parts(redis_url: Optional[str], storage_url: Optional[str]) -> Optional[str]:
    """What this machine lacks to start the services the demo was not given, as one line; else None."""
    import importlib.util
    import shutil

    if redis_url is None and shutil.which("redis-server") is None:
        return ("redis-server is not installed: install it (Debian: apt-get install redis-server) or pass "
                "--redis-url redis://HOST:PORT/0")
    if storage_url is None and importlib.util.find_spec("moto") is None:
        return ("the local S3 endpoint needs moto: pip install 'baton[local]' (or pass --storage-url "
                "s3://bucket/prefix for a store you have)")
    return None


def _start_services(stack: ExitStack, redis_url: Optional[str], storage_url: Optional[str], say: Say) -> tuple[str, str]:
    if redis_url is None:
        redis = stack.enter_context(_running(RedisServer(password=secrets.token_hex(16))))  # (its jobs hold none)
        redis_url = redis.url
        say(f"started redis-server on 127.0.0.1:{redis.port}, with a password of its own")
    if storage_url is None:
        s3 = stack.enter_context(_running(S3Server()))
        os.environ.update(s3.env())
        s3.create_bucket(BUCKET)
        storage_url = f"s3://{BUCKET}/demo"
        say(f"started an S3 endpoint (moto) on {s3.endpoint_url}, bucket {BUCKET}")
    return redis_url, storage_url


class _running:
    def __init__(self, service):
        self.service = service

    def __enter__(self):
        return self.service.start()

    def __exit__(self, *exc):
        self.service.stop()


def _wait(job, until: Callable[[JobStatus], bool], say: Say, timeout_s: float = 300) -> JobStatus:
    deadline, shown = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        status = job.status()
        line = progress_line(status)
        if (status.state, status.attempt, status.worker, status.epoch) != shown:
            shown = (status.state, status.attempt, status.worker, status.epoch)
            say("  " + line)
        if until(status) or status.state.terminal:
            return status
        time.sleep(0.05)
    raise TimeoutError("the demo job did not get there in time")


def _wait_for_a_checkpoint(job, store, say: Say, timeout_s: float = 300) -> tuple[JobStatus, Optional[int]]:
    """The job's status once it has committed a checkpoint mid-run (the store's manifest, read every 10 ms:
    a small job trains in seconds, faster than its status is written), and that checkpoint's step; None
    when it finished first."""
    paths, deadline, shown = JobPaths(job.id), time.monotonic() + timeout_s, 0.0
    while time.monotonic() < deadline:
        try:
            manifest = ManifestStore(store, paths).read()
        except FileNotFoundError:
            manifest = None
        if manifest is not None and (manifest.completed or manifest.latest is not None):
            return job.status(), None if manifest.completed or manifest.latest is None else manifest.latest.step
        if time.monotonic() - shown > 0.5:
            shown = time.monotonic()
            say("  " + progress_line(job.status()))
        time.sleep(0.01)
    raise TimeoutError("the demo job committed no checkpoint in time")


def _reference(spec: Path, out: Path, threads: int) -> Path:
    """`baton run` of the same spec, in a process of its own, with the worker's thread count."""
    store = out / "reference"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    subprocess.run([sys.executable, "-m", "baton", "run", str(spec), "--id", "reference", "--storage", f"file://{store}",
                    "--no-progress"], check=True, env=env, stdout=subprocess.DEVNULL, preexec_fn=die_with_parent)
    return store


def run_demo(spec: Path, out: Path, redis_url: Optional[str], storage_url: Optional[str], say: Say = print) -> int:
    out.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        redis_url, storage_url = _start_services(stack, redis_url, storage_url, say)
        env = {**os.environ, "BATON_REDIS_URL": redis_url, "BATON_STORAGE_URL": storage_url}
        ports = {n: free_port() for n in "ab"}
        workers = [WorkerProcess(f"demo-{n}@{os.uname().nodename}", {**env, "BATON_METRICS_PORT": str(ports[n])},
                                 str(out / f"worker-{n}.log")) for n in "ab"]
        stack.callback(stop_workers, workers)
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.wait_ready()
        say(f"started workers {', '.join(w.name for w in workers)} (logs in {out}; Prometheus metrics on "
            f"{', '.join(f'http://127.0.0.1:{p}/metrics' for p in ports.values())})")

        client = JobClient(redis_url=redis_url, storage_url=storage_url)
        job = client.submit(spec)
        say(f"submitted {spec} as job {job.id}")
        status, committed = _wait_for_a_checkpoint(job, open_store(storage_url), say)
        holder = next(w for w in workers if w.name == status.worker)
        holder.signal(signal.SIGKILL)
        said = f"right after the job committed its checkpoint at step {committed}" if committed is not None else \
            "after the job finished training (it committed no checkpoint before its end)"
        say(f"SIGKILL to {holder.name} (pid {holder.pid}) {said}: its lease will expire and the other worker "
            "takes the job over from its last checkpoint")
        final = _wait(job, lambda s: False, say)
        say(f"job {final.state.value}: attempt {final.attempt} on {final.worker}, resumed from step {final.resumed_from}")
        if final.state.value != "succeeded":
            say(f"error: {final.error}")
            return 1

        best = job.download(out, which="best")
        artifacts = job.download(out, which="final")
        say(f"fetched the best checkpoint to {best} and the final artifacts to {artifacts}")
        for line in job.report()["note"]:
            say(f"  report: {line}")

        store = open_store(storage_url)
        assert final.latest_checkpoint is not None  # (a job that succeeded committed its last checkpoint)
        distributed = load_bytes(store.get_bytes(final.latest_checkpoint))
        reference_store = _reference(spec, out, distributed["config"]["cpu_threads"])
        reference_files = open_store(f"file://{reference_store}")
        latest = ManifestStore(reference_files, JobPaths("reference")).read().latest
        assert latest is not None  # (the reference run finished)
        reference = load_bytes(reference_files.get_bytes(latest.key), latest.sha256)
        parts = {k: (distributed[k], reference[k]) for k in ("model", "optimizer", "scheduler", "rng")}
        difference = next((d for k, (a, b) in parts.items() if (d := first_difference(a, b, k))), None)
        tensors = sum(count_tensors(a) for a, _ in parts.values())
        if difference:
            say(f"NOT bit-exact against `baton run`: {difference}")
            return 1
        say(f"bit-exact: all {tensors} tensors of model, optimizer, scheduler and RNG equal (torch.equal) "
            f"to an uninterrupted `baton run` of the same spec")
        return 0
