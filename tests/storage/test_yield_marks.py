"""The scheduler's marks against a real Redis: a running job asked to yield for a waiting one, and the
mark withdrawn when that job stops waiting before the marked job's worker has read it."""
from __future__ import annotations

import pytest
import redis

from baton.storage.records import keys, leases, presence, refusals
from baton.storage.records.job_records import JobRecords
from baton.storage.records.scheduling import Scheduler
from tests.storage.test_pool import claim, submit


@pytest.fixture
def marked(redis_server):
    """'low' (priority 0) runs on the queue's one worker; 'urgent' (priority 10) waits: the turn marks 'low'."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushdb()
    records = JobRecords(client)
    presence.announce(client, "w1", ["default"], 30.0)
    submit(records, "low")
    token = claim(records, "low", worker="w1")
    submit(records, "urgent", priority=10)
    scheduler = Scheduler(client)
    [one] = scheduler.turn()
    assert (one.job_id, one.for_job) == ("low", "urgent")
    return records, scheduler, token, leases.Renewer(client, "low", "w1")


def test_a_mark_for_a_job_cancelled_before_the_worker_read_it_is_withdrawn(marked):
    records, scheduler, token, renew = marked
    assert records.cancel("urgent") == "cancelled"
    assert scheduler.turn() == []
    assert records.redis.hlen(keys.queue_yielding("default")) == 0
    assert renew(token, 30_000).yield_requested == ""  # the job trains on
    submit(records, "urgent2", priority=10)  # no cooldown left behind by a yield that never happened
    [again] = scheduler.turn()
    assert (again.job_id, again.for_job) == ("low", "urgent2")


def test_a_mark_the_worker_has_read_stays_for_the_job_yields_already(marked):
    records, scheduler, token, renew = marked
    assert renew(token, 30_000).yield_requested == "yielded to job urgent (priority 10)"
    assert records.cancel("urgent") == "cancelled"
    scheduler.turn()
    assert records.redis.hkeys(keys.queue_yielding("default")) == ["low"]  # its slot still counts as freed
    assert renew(token, 30_000).yield_requested == "yielded to job urgent (priority 10)"


def test_a_mark_for_a_job_still_waiting_is_kept(marked):
    records, scheduler, token, renew = marked
    assert scheduler.withdraw_stale("default") == []
    assert records.redis.hkeys(keys.queue_yielding("default")) == ["low"]


def test_no_worker_is_freed_for_a_job_it_said_it_cannot_host(redis_server):
    """'lowest' runs on w2, which said it cannot host 'urgent' (too few GPUs, say): 'low' on w1 yields
    instead; once both said no, nothing yields for it (it would start nowhere)."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushdb()
    records = JobRecords(client)
    for worker, job, priority in (("w1", "low", 0), ("w2", "lowest", -5)):
        presence.announce(client, worker, ["default"], 30.0)
        submit(records, job, priority=priority)
        claim(records, job, worker=worker)
    submit(records, "urgent", priority=10)
    refusals.note(client, "urgent", "w2")
    assert [(one.job_id, one.for_job) for one in Scheduler(client).turn()] == [("low", "urgent")]
    client.delete(keys.queue_yielding("default"))
    client.hdel(keys.job("low"), "yield_marked_at")
    refusals.note(client, "urgent", "w1")
    assert Scheduler(client).turn() == []
    submit(records, "urgent2", priority=10)  # a job behind it that w1 can host still gets a worker freed
    assert [(one.job_id, one.for_job) for one in Scheduler(client).turn()] == [("lowest", "urgent2")]
