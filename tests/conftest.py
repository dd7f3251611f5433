"""Real services for the tests: an S3 endpoint (moto's server) and redis-server, each on a free
loopback port, started once per session and stopped by PID. Tests never touch port 6379."""
from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

import pytest

# cuBLAS reads this once, at its first call: set it before any test touches CUDA
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

from baton.jobs.services import RedisServer, S3Server
import tests.helpers  # noqa: F401,E402 - arms the commit gate (helpers.kill_when) before any process is started

_bucket_names = itertools.count()


@pytest.fixture(scope="session")
def s3_server():
    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The standard AWS variables, pointing this process's boto3 at the test endpoint."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server.env()


@pytest.fixture
def s3_bucket(s3_server, s3_env):
    """A new, empty bucket; returns its name."""
    name = f"t{os.getpid()}-{next(_bucket_names)}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture(scope="session")
def redis_server():
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mlflow_server():
    """A real ``mlflow server`` with a SQLite backend (skipped without ``baton[mlflow]``'s server)."""
    pytest.importorskip("mlflow.server")
    from tests.mlflow_server import MlflowServer

    server = MlflowServer().start()
    yield server
    server.stop()


WORKER_READY_S = 120.0
"""How long a test waits for a worker to be ready: its forkserver imports torch, which a loaded machine
(the suite's other process, a neighbour) can stretch from a few seconds to tens."""


class Cluster:
    """Real ``baton worker`` processes against the test Redis and S3, and a client for them."""

    def __init__(self, env: dict, log_dir, redis_url: str, storage_url: str):
        self.env, self.log_dir = env, log_dir
        self.redis_url, self.storage_url = redis_url, storage_url
        self.workers: list = []
        self._client = None

    def start_workers(self, n: int = 2, queues: str = "default", **extra_env: str) -> list:
        from baton.jobs.services import WorkerProcess

        env = {"BATON_METRICS_PORT": "0", **self.env, **extra_env}
        new = [WorkerProcess(f"w{len(self.workers) + i}@test", env, str(self.log_dir / f"w{len(self.workers) + i}.log"),
                             queues) for i in range(n)]
        self.workers += new  # before they are ready: one that never gets there is stopped with the rest
        for worker in new:
            worker.start()
        for worker in new:
            worker.wait_ready(WORKER_READY_S)
        return new

    def worker(self, name: str):
        return next(w for w in self.workers if w.name == name)

    @property
    def client(self):
        from baton.jobs.client import JobClient

        if self._client is None:
            self._client = JobClient(redis_url=self.redis_url, storage_url=self.storage_url)
        return self._client

    def store(self):
        from baton.storage.stores.open import open_store

        return open_store(self.storage_url)

    def stop(self) -> None:
        from baton.jobs.services import stop_workers

        stop_workers(self.workers)  # all at once: each takes a second or two


@pytest.fixture
def cluster(redis_server, s3_server, s3_bucket, s3_env, tmp_path, monkeypatch):
    """A flushed Redis, a new bucket, and a way to start workers; every worker is stopped after."""
    import redis as redis_lib

    from tests.helpers import baton_env

    redis_lib.Redis.from_url(redis_server.url).flushdb()
    storage_url = f"s3://{s3_bucket}/runs"
    monkeypatch.setenv("BATON_ALLOWED_MODULES", "tests")
    env = baton_env(**s3_env, BATON_REDIS_URL=redis_server.url, BATON_STORAGE_URL=storage_url)
    c = Cluster(env, tmp_path, redis_server.url, storage_url)
    yield c
    c.stop()


@pytest.fixture
def open_dir():
    """A directory every user may write in (sticky, as /tmp): a job that runs as a user of its own
    (``BATON_JOB_USER``'s default) cannot reach the tests' private ``tmp_path``."""
    import shutil
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="baton-test-open-"))
    directory.chmod(0o1777)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Where ``BATONTEST_CPU_DIR`` names a directory (``bench/suite_cpu.py`` sets it), each test's CPU in
    this pytest process (its set-up, call and teardown, every thread) is appended to a file there: the
    part of a test's cost that no process of its own shows, and when it began and ended (which pytest process
    ran what, when)."""
    out = os.environ.get("BATONTEST_CPU_DIR")
    started, began = time.process_time(), time.time()
    yield
    if out:
        with open(os.path.join(out, f"{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps({"test": item.nodeid, "cpu_s": time.process_time() - started, "began": began,
                                "ended": time.time()}) + "\n")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need CUDA: skipped (with the reason) where there is none. The quick tier
    (``-m quick``: a maintainer's edit-test loop, about 2 minutes) is every test not marked ``slow`` (one
    that takes seconds: processes started, a run trained) outside the benchmarks' runs, and the slow tests
    marked ``quick`` that stand for their modules (a worker's loss, a shipped job, a multi-rank job...)."""
    quick = pytest.mark.quick
    for item in items:
        if "quick" not in item.keywords and "slow" not in item.keywords and "tests/bench/" not in item.nodeid:
            item.add_marker(quick)
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
