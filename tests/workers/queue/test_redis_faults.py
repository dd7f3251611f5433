"""Redis going away under a running job (a restart, a failover) is infrastructure, not the job's
failure: the worker waits for it while its lease may still be valid, and the job ends bit-exact.

A real redis-server with an append-only file (fsync always), stopped by PID with SIGKILL and
started again on the same port from its data; a real `baton worker`; moto's S3 behind a proxy
that holds a checkpoint upload, so Redis goes away while a commit is in flight.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from baton.storage.records import keys
from baton.jobs.services import _wait, die_with_parent, free_port

from tests.conftest import Cluster
from tests.helpers import assert_same_training, baton_env, read_manifest
from tests.netfault import FaultyProxy
from tests.workers.queue.test_worker_loss import SPEC, running_at_step, wait_for

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

    def start(self, appendonly: bool = True) -> "PersistentRedis":
        self.proc = subprocess.Popen(
            [shutil.which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes" if appendonly else "no", "--appendfsync", "always", "--dir", self.dir,
             "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
        _wait(lambda: redis.Redis(port=self.port).ping(), f"redis-server on {self.port}", self.proc)
        return self

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def backup(self) -> bytes:
        """A snapshot of everything now (SAVE), as a nightly backup would take."""
        redis.Redis(port=self.port).save()
        return (Path(self.dir) / "dump.rdb").read_bytes()

    def restore(self, snapshot: bytes) -> None:
        """Crash, then come back from ``snapshot`` (not from the append-only file): Redis is behind."""
        self.kill()
        shutil.rmtree(Path(self.dir) / "appendonlydir", ignore_errors=True)
        (Path(self.dir) / "dump.rdb").write_bytes(snapshot)
        self.start(appendonly=False)

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


@pytest.mark.slow
def test_a_redis_restart_during_a_checkpoint_commit_does_not_fail_the_job(restartable, reference):
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
    # the commit did meet the outage: at its fence, or (when the held upload was the manifest's, past the
    # fence) at its record
    assert re.search(r"Redis unavailable for job outage: the (checkpoint fence|committed checkpoint's record)",
                     worker.log()), worker.log()
    assert_same_training(reference, "reference", cluster.store(), "outage")


@pytest.mark.slow
def test_redis_restored_from_a_backup_behind_the_store_costs_no_attempt(restartable, reference):
    """Defect 3: attempt numbers (the fencing tokens) lived only in Redis. Redis comes back from a
    backup taken at attempt 1 while attempt 2 trains: the claim of "attempt 2" again (a second holder
    of that number) finds the manifest held by the lost claim of 2, catches up past it as attempt 3
    instead of being fenced out and reaped as a lost worker, and the job ends bit-exact."""
    cluster, server, _ = restartable
    workers = cluster.start_workers(2)
    job = cluster.client.submit(SPEC, "rewound")
    wait_for(running_at_step(job, 3))
    snapshot = server.backup()  # attempt 1 running
    assert job.cancel() == "requested"
    assert job.wait(timeout=60, progress=False).state.value == "cancelled"
    assert job.resume() == 2
    wait_for(lambda: any(e["attempt"] == 2 for e in read_manifest(cluster.store(), "rewound")["checkpoints"]),
             every=0.02)  # attempt 2 trains and has committed

    restored_at = time.time()
    server.restore(snapshot)  # the record says attempt 1, running, its lease long expired
    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded", f"{final.error}\n{final.traceback}"
    assert (final.attempt, final.lost) == (3, 0)  # caught up; nothing counted as a lost worker
    logs = "".join(w.log() for w in workers)
    assert "was behind the manifest" in logs and "caught up as attempt 3" in logs
    manifest = read_manifest(cluster.store(), "rewound")
    assert (manifest["attempt"], manifest["completed"]) == (3, True)
    assert not [e for e in manifest["checkpoints"] if e["attempt"] == 2 and e["created_at"] > restored_at]
    assert_same_training(reference, "reference", cluster.store(), "rewound")


@pytest.mark.slow
def test_redis_paused_past_the_lease_costs_no_retry_attempt(restartable, reference):
    """redis-server SIGSTOPped (by PID) for twice the lease TTL: the lease lapses by Redis's own
    clock while nobody can renew it. With retry.max_attempts 1 one counted loss would fail the job:
    it must end succeeded, bit-exact, with no loss counted."""
    cluster, server, _ = restartable
    ttl_s = 3.0
    cluster.start_workers(1, BATON_LEASE_TTL_S=str(ttl_s), BATON_HEARTBEAT_S="0.75", BATON_REAPER_PERIOD_S="0.5")
    job = cluster.client.submit({**SPEC, "retry": {"max_attempts": 1}}, "paused-redis")
    wait_for(running_at_step(job, 6))
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(2 * ttl_s)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)

    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded", f"{final.error}\n{final.traceback}"
    assert final.attempt >= 2 and final.lost == 0  # the attempt stopped by the outage was not a loss
    assert_same_training(reference, "reference", cluster.store(), "paused-redis")


def test_a_replica_answering_masterdown_during_a_failover_is_waited_out_not_a_job_failure():
    """During a failover a replica answers MASTERDOWN (and READONLY, TRYAGAIN) until it is promoted:
    a ResponseError, but one that passes when Redis comes back, like a dropped connection."""
    import threading

    import redis as redis_lib

    from baton.jobs.services import RedisServer
    from baton.workers.queue.redis_retry import while_leased

    server = RedisServer().start()
    try:
        client = redis_lib.Redis.from_url(server.url, decode_responses=True)
        client.set("k", "v")
        client.config_set("replica-serve-stale-data", "no")
        client.replicaof("127.0.0.1", free_port())  # its primary is gone: reads answer MASTERDOWN
        with pytest.raises(redis_lib.exceptions.ResponseError, match="MASTER is down"):
            client.get("k")
        threading.Timer(0.5, lambda: redis_lib.Redis.from_url(server.url).replicaof("NO", "ONE")).start()  # promoted
        assert while_leased(lambda: client.exists("k") >= 0 and "promoted",
                            lambda: time.monotonic() + 30, "a read during a failover") == "promoted"
    finally:
        server.stop()


@pytest.mark.slow
def test_a_worker_whose_start_meets_a_redis_outage_waits_for_it_and_starts_whole(redis_server, s3_bucket, s3_env,
                                                                                  tmp_path):
    """Redis gone between the worker's broker connection and its start-up's own Redis calls: the worker
    waits for Redis, then starts its reaper and announces its queues (its start-up raised, and it took
    jobs with no reaper, no preemption handler and no presence: a frozen holder was never reaped)."""
    from baton.storage.records import keys
    from baton.jobs.services import WorkerProcess

    redis.Redis.from_url(redis_server.url).flushdb()
    proxy = FaultyProxy(redis_server.port)
    env = baton_env(**s3_env, BATON_REDIS_URL=f"redis://127.0.0.1:{proxy.port}/0",
                    BATON_STORAGE_URL=f"s3://{s3_bucket}/runs", BATON_METRICS_PORT="0")
    worker = WorkerProcess("late@test", env, str(tmp_path / "late.log")).start()
    try:
        wait_for(lambda: "connected to the broker; starting up" in worker.log(), timeout=60, every=0.01)
        proxy.set("cut")  # start-up's warm-up takes seconds yet: its Redis calls meet the outage
        wait_for(lambda: "Redis unavailable while" in worker.log() or "Signal handler" in worker.log(), timeout=60)
        time.sleep(OUTAGE_S)
        proxy.set("pass")
        wait_for(lambda: "baton worker late@test ready" in worker.log(), timeout=60)
        client = redis.Redis.from_url(redis_server.url, decode_responses=True)
        assert wait_for(lambda: client.zrange(keys.queue_workers("default"), 0, -1), timeout=30) == ["late@test"]
    finally:
        worker.stop()
        proxy.close()


@pytest.mark.slow
def test_a_redis_restart_while_a_gang_starts_does_not_fail_the_job(restartable):
    """A two-node gang is admitted; once its leader's worker serves the attempt's training process,
    that process is held at its storage calls (through the S3 proxy, before it publishes the
    rendezvous), Redis is killed, the calls go on, and Redis comes back 1.5 s later: the leader
    publishes the rendezvous (and the follower waits for it) during the outage. Redis faults are
    never the job's failure: the job succeeds, and no attempt is failed or lost."""
    from tests.workers.parallel.test_multinode import NODES_ENV, TWO_NODES

    cluster, server, proxy = restartable
    cluster.start_workers(2, **NODES_ENV, AWS_ENDPOINT_URL=proxy.endpoint_url, BATON_LEASE_TTL_S="30")
    direct = redis.Redis(port=server.port)
    job = cluster.client.submit(TWO_NODES, "gang-outage")
    # the worker serves the training process's calls once it has recorded the process's pid
    wait_for(lambda: any("job gang-outage: attempt 1 trains in process" in w.log() for w in cluster.workers),
             timeout=120, every=0.002)
    proxy.set("hold")  # the training process waits at its storage calls, before it publishes the rendezvous
    wait_for(lambda: proxy.held_bytes > 0, timeout=30, every=0.005)
    assert direct.hget(keys.gang("gang-outage"), "state") == b"admitted"  # not published yet
    server.kill()
    proxy.set("pass")
    time.sleep(1.5)
    server.start()
    final = job.wait(timeout=180, progress=False)
    assert final.state.value == "succeeded", f"{final.error}\n{final.traceback}"
    assert final.lost == 0, final
