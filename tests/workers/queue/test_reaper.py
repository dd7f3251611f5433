"""Leases and the reaper against a real Redis, publishing through Celery onto the real queue."""
from __future__ import annotations

import base64
import json
import os
import signal
import threading
import time

import pytest
import redis

from baton.storage.records import keys
from baton.storage.records.job_records import JobRecords
from baton.schemas.settings import BatonSettings
from baton.storage.records import leases as lease, reaping as reaper
from baton.workers.queue.reaper import Reaper
from baton.storage.records.messages import make_app, publish_run


@pytest.fixture
def env(redis_server):
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushdb()
    celery = make_app(BatonSettings(redis_url=redis_server.url))
    return client, JobRecords(client), lambda job, attempt, queue: publish_run(celery, job, attempt, queue)


def queued_messages(client, queue: str = "default") -> list[list]:
    """The (job id, attempt) of every message waiting in a Celery queue, oldest first."""
    out = []
    for raw in reversed(client.lrange(queue, 0, -1)):
        body = json.loads(base64.b64decode(json.loads(raw)["body"]))
        out.append(body[0])
    return out


def new_job(records: JobRecords, job_id: str, max_attempts: int = 2) -> None:
    records.create(job_id, {"name": job_id, "spec": "{}", "queue": "default", "max_attempts": str(max_attempts)})
    records.published(job_id, records.pending_mark(job_id))


def test_an_expired_lease_is_requeued_then_failed_after_max_attempts(env):
    client, records, publish = env
    new_job(records, "j", max_attempts=2)
    assert lease.claim(client, "j", 1, "w1", ttl_s=0.2).ok
    assert not lease.claim(client, "j", 1, "w2", ttl_s=5).ok  # the same delivery again: dropped
    assert reaper.reap_once(client, publish, records) == []  # lease alive: nothing to do
    time.sleep(0.3)
    assert reaper.reap_once(client, publish, records) == [("j", "requeue")]
    assert reaper.reap_once(client, publish, records) == []  # idempotent: a second reaper does nothing
    assert queued_messages(client) == [["j", 2]]
    assert records.status("j").state.value == "retrying" and records.status("j").lost == 1

    assert not lease.claim(client, "j", 1, "w3", ttl_s=5).ok  # the stale attempt-1 message
    assert lease.claim(client, "j", 2, "w2", ttl_s=0.2).ok
    time.sleep(0.3)
    assert reaper.reap_once(client, publish, records) == [("j", "failed")]
    status = records.status("j")
    assert status.state.value == "failed" and status.lost == 2 and "retry.max_attempts" in status.error
    assert queued_messages(client) == [["j", 2]]  # no third attempt


def test_fenced_writes_need_the_exact_live_lease(env):
    client, records, _ = env
    new_job(records, "f")
    held = lease.claim(client, "f", 1, "w1", ttl_s=5)
    assert held.ok and held.token == lease.token(1, "w1", held.nonce)
    assert records.fenced_set("f", held.token, {"step": 3})
    assert not records.fenced_set("f", lease.token(1, "other", held.nonce), {"step": 4})
    assert not records.fenced_set("f", lease.token(2, "w1", held.nonce), {"step": 5})
    assert not records.fenced_set("f", lease.token(1, "w1", "another-claim"), {"step": 6})  # same attempt and worker
    assert records.status("f").step == 3


def test_a_publish_lost_in_a_crash_is_published_again(env, monkeypatch):
    client, records, publish = env
    records.create("p", {"name": "p", "spec": "{}", "queue": "default", "max_attempts": "3"})  # mark left behind
    assert reaper.reap_once(client, publish, records) == []  # too fresh: the publisher may still be at it
    monkeypatch.setattr(reaper, "REPUBLISH_AFTER_S", 0.0)
    time.sleep(0.01)
    assert reaper.reap_once(client, publish, records) == [("p", "republish")]
    assert queued_messages(client) == [["p", 1]]
    assert records.pending_mark("p") is None


def test_one_reaper_holds_the_turn_until_it_stops_keeping_it(env):
    client, _, _ = env
    assert reaper.take_turn(client, "w1", period_s=0.2)  # free: taken
    assert not reaper.take_turn(client, "w2", period_s=0.2)  # w1's turn
    for _ in range(3):
        time.sleep(0.25)  # past a period: w1 keeps it each period
        assert reaper.take_turn(client, "w1", period_s=0.2, held=True)
        assert not reaper.take_turn(client, "w2", period_s=0.2)
    assert not reaper.take_turn(client, "w2", period_s=0.2, held=True)  # (a reaper that only thinks it holds it)
    time.sleep(0.2 * reaper.TURN_HELD_PERIODS + 0.05)  # w1 stopped keeping it (gone)
    assert reaper.take_turn(client, "w2", period_s=0.2)  # lapsed: another takes it


def test_a_message_taken_but_never_claimed_is_published_again(env):
    """A worker that dies between Celery's delivery and the claim leaves no outbox mark (the
    publish was acked by the broker) and its message sits in kombu's unacked set for hours."""
    client, records, publish = env
    records.create("t", {"name": "t", "spec": "{}", "queue": "default", "max_attempts": "3"})
    records.publish_marked("t", 1, publish)
    assert records.pending_mark("t") is None
    client.rpop("default")  # taken off the queue by a worker that then dies before claiming
    assert reaper.reap_once(client, publish, records, unclaimed_after_s=0.3) == []  # it may still claim
    time.sleep(0.35)
    assert reaper.reap_once(client, publish, records, unclaimed_after_s=0.3) == [("t", "republish")]
    assert queued_messages(client) == [["t", 1]]
    assert records.pending_mark("t") is None

    assert lease.claim(client, "t", 1, "w2", ttl_s=5).ok  # claimed: never published again
    time.sleep(0.7)
    assert reaper.reap_once(client, publish, records, unclaimed_after_s=0.3) == []


def test_a_job_waiting_for_a_busy_pool_is_republished_ever_more_rarely(env):
    """Each re-publish doubles the wait for the next one: a long queue gains few duplicates."""
    client, records, publish = env
    records.create("q", {"name": "q", "spec": "{}", "queue": "default", "max_attempts": "3"})
    records.publish_marked("q", 1, publish)
    deadline = time.monotonic() + 1.45
    republished = 0
    while time.monotonic() < deadline:
        republished += len(reaper.reap_once(client, publish, records, unclaimed_after_s=0.2))
        time.sleep(0.02)
    # published at 0; again after 0.2, 0.2+0.4, 0.6+0.8: 2 or 3 by 1.45 s, never one per bound (7)
    assert 2 <= republished <= 3
    assert len(queued_messages(client)) == 1 + republished


def test_a_claim_behind_the_manifest_catches_up_while_its_lease_holds(env):
    client, records, _ = env
    new_job(records, "c")
    held = lease.claim(client, "c", 1, "w1", ttl_s=5)
    ahead = lease.token(4, "w1", held.nonce)
    assert lease.catch_up(client, "c", held.token, 1, 4, ahead, ttl_s=5)
    assert (records.status("c").attempt, records.status("c").lost) == (4, 0)
    assert client.get(keys.lease("c")) == ahead and records.fenced_set("c", ahead, {})
    assert "caught up as attempt 4" in records.status("c").last_event
    # the same call again (its reply was lost, while_leased retries): it is already done, not refused
    assert lease.catch_up(client, "c", held.token, 1, 4, ahead, ttl_s=5)
    assert (records.status("c").attempt, client.get(keys.lease("c"))) == (4, ahead)
    assert not lease.catch_up(client, "c", held.token, 1, 6, lease.token(6, "w1", held.nonce), ttl_s=5)  # moved on

    stale = lease.claim(client, "d", 1, "w1", ttl_s=5)  # no record: nothing to claim
    assert not stale.ok
    new_job(records, "d")
    first = lease.claim(client, "d", 1, "w1", ttl_s=5)
    client.set(keys.lease("d"), lease.token(1, "w2", "other"))  # another claim holds the job now
    assert not lease.catch_up(client, "d", first.token, 1, 3, lease.token(3, "w1", first.nonce), ttl_s=5)
    assert records.status("d").attempt == 1


def test_release_if_still_mine_gives_the_job_back_uncounted_only_while_it_is(env):
    client, records, publish = env
    new_job(records, "m", max_attempts=1)
    held = lease.claim(client, "m", 1, "w1", ttl_s=5)  # the lease is still ours when Redis answers again
    assert records.release_if_still_mine("m", held.token, 1, "w1", "Redis was unreachable") == 2
    status = records.status("m")
    assert (status.state.value, status.attempt, status.lost) == ("retrying", 1, 0) and not client.exists(keys.lease("m"))

    lapsed = lease.claim(client, "m", 2, "w1", ttl_s=0.1)  # it lapsed, and nobody has touched the job since
    time.sleep(0.2)
    assert records.release_if_still_mine("m", lapsed.token, 2, "w1", "Redis was unreachable") == 3
    assert (records.status("m").state.value, records.status("m").lost) == ("retrying", 0)

    other = lease.claim(client, "m", 3, "w2", ttl_s=0.1)
    time.sleep(0.2)  # w2's lapsed lease is not w1's to release, nor attempt 3 as w1's attempt 2
    assert records.release_if_still_mine("m", lapsed.token, 2, "w1", "x") == -1
    assert records.release_if_still_mine("m", lease.token(3, "w1", other.nonce), 3, "w1", "x") == -1
    assert reaper.reap_once(client, publish, records) == [("m", "failed")]  # no outage seen: a loss (max 1)
    assert records.release_if_still_mine("m", other.token, 3, "w2", "x") == -1  # too late: the reaper decided
    assert (records.status("m").state.value, records.status("m").lost) == ("failed", 1)


def test_a_lease_lapsed_during_a_marked_outage_is_requeued_uncounted(env):
    client, records, publish = env
    new_job(records, "o", max_attempts=1)
    assert lease.claim(client, "o", 1, "w1", ttl_s=0.1).ok
    time.sleep(0.2)
    client.set(keys.REDIS_OUTAGE, "w9", px=5000)  # another worker's reaper saw Redis unreachable
    assert reaper.reap_once(client, publish, records) == [("o", "outage")]
    status = records.status("o")
    assert (status.state.value, status.lost) == ("retrying", 0) and "Redis was unreachable" in status.last_event
    assert queued_messages(client) == [["o", 2]]


def test_a_reaper_that_lived_through_a_redis_pause_does_not_count_the_lapsed_lease(tmp_path):
    """redis-server SIGSTOPped (by PID) past a lease TTL: the holder could not renew. The reaper,
    whose own calls were held back meanwhile, re-queues the job without counting a loss; once its
    grace has passed, an expired lease counts again."""
    from baton.jobs.services import RedisServer

    server = RedisServer(workdir=str(tmp_path)).start()
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=10)
        records = JobRecords(client)
        celery = make_app(BatonSettings(redis_url=server.url))
        new_job(records, "p", max_attempts=2)
        assert lease.claim(client, "p", 1, "w1", ttl_s=0.6).ok
        thread = Reaper(client, lambda job, attempt, queue: publish_run(celery, job, attempt, queue),
                               period_s=0.2, worker="r1", lease_ttl_s=0.6)
        thread.start()
        time.sleep(0.3)
        os.kill(server.proc.pid, signal.SIGSTOP)
        time.sleep(1.5)  # more than the lease TTL: it expires meanwhile, by Redis's own clock
        os.kill(server.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 10
        while records.status("p").state.value == "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        status = records.status("p")
        assert (status.state.value, status.lost) == ("retrying", 0), status
        assert "lapsed while Redis was unreachable" in status.last_event

        time.sleep(thread.grace_s + 0.3)  # the grace is over (and so is the mark it set)
        assert lease.claim(client, "p", 2, "w1", ttl_s=0.2).ok
        deadline = time.monotonic() + 10
        while records.status("p").state.value == "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        status = records.status("p")
        assert (status.state.value, status.lost) == ("retrying", 1) and "expired" in status.last_event
        thread.stop()
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()


@pytest.mark.slow
def test_a_worker_with_too_few_gpus_passes_a_data_parallel_job_on_unclaimed(env, monkeypatch):
    """A job of N ranks on cuda is claimed only by a worker that can give it N GPUs: another
    hands the message back to its queue, uses no attempt, counts nothing, and says why."""
    from baton.schemas.spec import JobSpec
    from baton.workers.parallel.launcher import devices_missing
    from baton.workers.queue import reception
    from baton.workers.queue.intake import run_job
    from baton.workers.queue.worker_control import WorkerContext
    from baton.workers.queue.preemption import PREEMPTION

    from tests.helpers import make_spec, wait_for

    client, records, publish = env
    spec = JobSpec.parse(make_spec(resources={"device": "cuda", "processes": 4}))
    records.create("big", {"name": "big", "spec": json.dumps(spec.model_dump(mode="json")), "queue": "gpu4",
                           "max_attempts": "2"})
    records.published("big", records.pending_mark("big"))
    monkeypatch.setattr(reception, "PASS_ON_WAIT_S", 1.5)
    ctx = WorkerContext(BatonSettings(), client, records, publish, PREEMPTION, "one-gpu@test", offered_gpus=lambda: 1)
    during: list = []  # a reaper pass while the worker holds the message: it must not publish a copy
    reaping = threading.Timer(0.8, lambda: during.extend(reaper.reap_once(client, publish, records,
                                                                          unclaimed_after_s=0.2)))
    reaping.start()
    assert run_job(ctx, "big", 1) == "passed on"
    reaping.join()
    assert during == [] and client.hget(keys.job("big"), "republished") is None
    status = records.status("big")
    assert (status.state.value, status.attempt, status.lost) == ("queued", 0, 0)
    assert "one-gpu@test passed it on: resources.processes: 4 ranks need 4 GPUs" in status.last_event
    assert "offers 1" in status.last_event and client.get(keys.lease("big")) is None
    assert queued_messages(client, "gpu4") == []  # held aside (the worker took its next message meanwhile)...
    wait_for(lambda: queued_messages(client, "gpu4") == [["big", 1]], timeout=10,  # ...then back on its own queue
             what="the message back on its queue, the same attempt")
    assert reaper.reap_once(client, publish, records) == []  # its wait for a claim starts again
    monkeypatch.setattr(reception, "PASS_ON_WAIT_S", 0.0)
    assert run_job(ctx, "big", 3) == "dropped"  # a stale message is not passed on
    assert queued_messages(client, "gpu4") == [["big", 1]]

    # who can host what: a GPU per rank, on a worker with GPUs; CPU jobs and CPU-only workers are not asked
    assert devices_missing("cuda", 4, 4) is None and devices_missing("auto", 2, 8) is None
    assert devices_missing("auto", 2, 1) and devices_missing("cuda", 8, 4)
    assert devices_missing("cpu", 4, 1) is None and devices_missing("auto", 2, 0) is None
    assert devices_missing("cuda", 1, 1) is None


def _calls(client, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_period_looks_only_at_the_leases_past_their_expiry_not_at_every_running_job(env):
    """The due index: 300 running jobs with live leases cost a period's pass nothing per job; the one
    whose lease lapsed is found without a sweep over the others."""
    client, records, publish = env
    for n in range(300):
        new_job(records, f"live{n}")
        assert lease.claim(client, f"live{n}", 1, f"w{n}", ttl_s=30).ok
    new_job(records, "lapsing")
    assert lease.claim(client, "lapsing", 1, "gone", ttl_s=0.2).ok
    looked = _calls(client, "pttl"), _calls(client, "hget")
    assert reaper.reap_due(client, publish, records) == []
    assert (_calls(client, "pttl"), _calls(client, "hget")) == looked  # nothing was due: no job read
    time.sleep(0.3)
    assert reaper.reap_due(client, publish, records) == [("lapsing", "requeue")]
    assert _calls(client, "pttl") - looked[0] == 1  # that job alone
    assert client.zscore(keys.LEASES_DUE, "lapsing") is None  # it runs no more: out of the index
    assert queued_messages(client) == [["lapsing", 2]]


def test_a_renewal_moves_the_lease_in_the_index_and_a_sweep_finds_what_the_index_lacks(env):
    client, records, publish = env
    new_job(records, "r")
    claimed = lease.claim(client, "r", 1, "w1", ttl_s=0.3)
    first = client.zscore(keys.LEASES_DUE, "r")
    time.sleep(0.2)
    assert lease.Renewer(client, "r", "w1")(claimed.token, 300).held
    assert client.zscore(keys.LEASES_DUE, "r") >= first + 150  # its expiry moved with the renewal
    client.zrem(keys.LEASES_DUE, "r")  # (an index entry lost, as by a record restored by hand)
    time.sleep(0.4)
    assert reaper.reap_due(client, publish, records) == []  # the index no longer knows it ...
    assert reaper.reap_once(client, publish, records) == [("r", "requeue")]  # ... the sweep does


def test_a_renewal_writes_the_offered_fields_only_while_its_lease_holds(env):
    client, records, publish = env
    new_job(records, "p")
    claimed = lease.claim(client, "p", 1, "w1", ttl_s=5)
    renew = lease.Renewer(client, "p", "w1")
    assert renew(claimed.token, 5000, {"step": 7, "loss": 0.5}).held
    assert client.hmget(keys.job("p"), "step", "loss") == ["7", "0.5"]
    stale = lease.token(1, "w1", "another-claim")
    assert not renew(stale, 5000, {"step": 99}).held
    assert client.hget(keys.job("p"), "step") == "7"  # a stale holder writes nothing


def test_the_heartbeat_writes_the_newest_offered_progress_with_its_renewals(env):
    """Progress costs no command of its own: offers between two renewals are merged, newest wins."""
    from baton.workers.queue.heartbeat import Heartbeat

    client, records, publish = env
    new_job(records, "h")
    claimed = lease.claim(client, "h", 1, "w1", ttl_s=3)
    beat = Heartbeat(client, "h", claimed.token, "w1", ttl_s=3, every_s=0.2)
    sets = _calls(client, "hset")
    for step in range(1, 501):
        beat.offer({"step": step, "loss": 1.0 / step})
    beat.offer({"latest_checkpoint": "ck-500"})
    beat.start()
    try:
        deadline = time.monotonic() + 5
        while client.hget(keys.job("h"), "latest_checkpoint") is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        beat.stop()
    assert client.hmget(keys.job("h"), "step", "latest_checkpoint") == ["500", "ck-500"]
    assert _calls(client, "hset") - sets <= 3  # one per renewal (at most a couple ran), not one per offer
    assert beat.take_pending() == {}


def test_every_path_that_would_queue_a_running_job_again_honours_a_cancel_asked_for_meanwhile(env):
    """A cancel reaches a running job at its next step; if its attempt ends before that step (a lapsed
    lease, a lost or hung attempt, a release after a Redis outage), the job ends cancelled there,
    uncounted, with no message published and no place in its line."""
    client, records, publish = env
    for job_id in ("lapsed", "lost", "outage"):
        new_job(records, job_id, max_attempts=1)  # (its last retry: it would have failed)
    lapsed = lease.claim(client, "lapsed", 1, "w1", ttl_s=0.1)
    lost = lease.claim(client, "lost", 1, "w1", ttl_s=5)
    outage = lease.claim(client, "outage", 1, "w1", ttl_s=5)
    assert lapsed.ok and lost.ok and outage.ok
    assert {records.cancel(job_id) for job_id in ("lapsed", "lost", "outage")} == {"requested"}
    time.sleep(0.2)

    assert reaper.reap_once(client, publish, records) == [("lapsed", "cancelled")]
    assert records.release_lost("lost", lost.token, "the training process died", "") == -2
    assert records.release_if_still_mine("outage", outage.token, 1, "w1", "Redis was unreachable") == -2
    for job_id in ("lapsed", "lost", "outage"):
        status = records.status(job_id)
        assert (status.state.value, status.attempt, status.lost) == ("cancelled", 1, 0), status
        assert not client.sismember(keys.ACTIVE, job_id) and not client.hget(keys.job(job_id), "cancel_requested")
        assert not client.hget(keys.job(job_id), "publish_pending")
    assert queued_messages(client) == [] and records.pool.state("default").waiting == []
    assert records.pool.usage("default") == {} and reaper.reap_once(client, publish, records) == []
