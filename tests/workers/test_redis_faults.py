"""Redis going away under a running job (a restart, a failover) is infrastructure, not the job's
failure: the worker waits for it while its lease may still be valid, and the job ends bit-exact.

A real redis-server with an append-only file (fsync always), stopped by PID with SIGKILL and
started again on the same port from its data; a real `baton worker`; moto's S3 behind a proxy
that holds a checkpoint upload, so Redis goes away while a commit is in flight.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest
import redis

from jobs.services import _wait, die_with_parent, free_port
from tests.conftest import Cluster
from tests.helpers import assert_same_training, baton_env
from tests.netfault import FaultyProxy
from tests.workers.test_worker_loss import SPEC, reference, running_at_step, wait_for  # noqa: F401 (fixture)

OUTAGE_S = 3.0
"""How long Redis stays away: well past a checkpoint commit and two heartbeats, well inside the lease."""


class PersistentRedis:
    """redis-server on a fixed port that keeps every write in its append-only file (fsync always),
    so it can be killed and started again with its data, as a restarted production Redis is."""

    def __init__(self, directory):
        self.port, self.dir, self.proc = free_port(), str(directory), None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "PersistentRedis":
        self.proc = subprocess.Popen(
            [shutil.which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", self.dir, "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
        _wait(lambda: redis.Redis(port=self.port).ping(), f"redis-server on {self.port}", self.proc)
        return self

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.fixture
def restartable(tmp_path, s3_server, s3_bucket, s3_env, monkeypatch):
    """A cluster on its own persistent Redis, its S3 traffic through a proxy that can hold uploads."""
    (tmp_path / "redis").mkdir()
    server = PersistentRedis(tmp_path / "redis").start()
    proxy = FaultyProxy(s3_server.port)
    monkeypatch.setenv("BATON_ALLOWED_MODULES", "tests")
    storage_url = f"s3://{s3_bucket}/runs"
    env = baton_env(**s3_env, BATON_REDIS_URL=server.url, BATON_STORAGE_URL=storage_url)
    cluster = Cluster(env, tmp_path, server.url, storage_url)
    yield cluster, server, proxy
    cluster.stop()
    proxy.close()
    server.stop()


def test_a_redis_restart_during_a_checkpoint_commit_does_not_fail_the_job(restartable, reference):  # noqa: F811
    cluster, server, proxy = restartable
    # a long lease: the outage must end inside it however loaded this machine is
    worker, = cluster.start_workers(1, AWS_ENDPOINT_URL=proxy.endpoint_url, BATON_LEASE_TTL_S="30")
    job = cluster.client.submit(SPEC, "outage")
    wait_for(running_at_step(job, 6))
    proxy.set("hold")  # the next checkpoint's upload starts and stays in flight
    wait_for(lambda: proxy.held_bytes > 0, timeout=30, every=0.01)
    server.kill()  # Redis is gone while that checkpoint waits to be fenced and committed
    proxy.set("pass")  # the upload finishes: its fence and commit meet the outage
    time.sleep(OUTAGE_S)
    server.start()  # the same port, the same data

    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded", f"{final.error}\n{final.traceback}"
    assert (final.attempt, final.lost) == (1, 0)  # the same attempt carried on: nothing was retried
    assert "Redis unavailable for job outage: the checkpoint fence" in worker.log()  # the commit did meet the outage
    assert_same_training(reference, "reference", cluster.store(), "outage")
