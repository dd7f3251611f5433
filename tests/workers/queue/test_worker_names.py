"""A worker's name is NAME@HOST everywhere it shows (its log, the queue's presence, a job's record):
``--name w1`` gets this machine's host, as ``baton-PID@HOST`` does by default (Celery alone would read
a bare ``w1`` as the host and call the worker ``celery@w1``)."""
from __future__ import annotations

import pytest

import socket

from baton.storage.records import keys
from baton.jobs.services import WorkerProcess
from tests.workers.queue.test_worker_loss import wait_for


@pytest.mark.slow
def test_a_name_without_a_host_gets_this_machines(cluster):
    import redis

    worker = WorkerProcess("plain", {"BATON_METRICS_PORT": "0", **cluster.env}, str(cluster.log_dir / "plain.log"),
                           "default").start()
    cluster.workers.append(worker)
    full = f"plain@{socket.gethostname()}"
    wait_for(lambda: f"baton worker {full} ready" in worker.log(), timeout=60)
    client = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
    assert wait_for(lambda: client.zrange(keys.queue_workers("default"), 0, -1), timeout=30) == [full]
