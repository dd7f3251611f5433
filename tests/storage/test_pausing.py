"""Pausing and continuing a job's record against a real Redis: only the attempt holding the lease pauses
it (a stranger's token, or a fenced-out attempt's, changes nothing); a paused job holds no slot, no place
in a line and is nothing for the reaper; only a paused job continues, once."""
from __future__ import annotations

import pytest
import redis

from baton.storage.records import keys, pausing, reaping
from baton.storage.records.job_records import JobRecords
from tests.storage.test_pool import claim, order, submit


@pytest.fixture
def records(redis_server):
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushdb()
    return JobRecords(client)


def test_only_the_lease_holder_pauses_and_a_paused_job_is_out_of_the_pool(records):
    submit(records, "j")
    token = claim(records, "j")
    assert pausing.pause(records.redis, "j", "1:stranger@elsewhere:0000", "paused by a stranger") == 0
    assert records.status("j").state.value == "running"

    assert pausing.pause(records.redis, "j", token, "paused at step 10 on w") == 1
    status = records.status("j")
    assert (status.state.value, status.last_event) == ("paused", "paused at step 10 on w")
    assert not records.redis.exists(keys.lease("j"))
    assert "j" not in records.redis.smembers(keys.ACTIVE)
    assert records.pool.state("default").running == [] and order(records) == []
    assert reaping.reap_once(records.redis, lambda *a: None, records) == []
    assert pausing.pause(records.redis, "j", token, "again") == 0  # its lease is gone with the pause


def test_a_paused_job_continues_once_to_its_next_pause(records):
    submit(records, "j")
    assert pausing.continue_job(records.redis, "j", 20, "not paused") == -1  # a waiting job: nothing to continue
    assert pausing.pause(records.redis, "j", claim(records, "j"), "paused at step 10") == 1
    assert pausing.continue_job(records.redis, "j", 20, "promoted") == 2
    status = records.status("j")
    assert (status.state.value, status.pause_at, status.last_event) == ("retrying", 20, "promoted")
    assert order(records) == ["j"] and "j" in records.redis.smembers(keys.ACTIVE)
    assert pausing.continue_job(records.redis, "j", 30, "twice") == -1
    assert pausing.pause(records.redis, "j", claim(records, "j"), "paused at step 20") == 1
    assert pausing.continue_job(records.redis, "j", None, "to its end") == 3
    assert records.status("j").pause_at is None


def test_a_cancel_asked_for_while_it_stops_ends_it_cancelled(records):
    submit(records, "j")
    token = claim(records, "j")
    assert records.cancel("j") == "requested"
    assert pausing.pause(records.redis, "j", token, "paused at step 10") == -2
    assert records.status("j").state.value == "cancelled"
    submit(records, "k")
    assert pausing.pause(records.redis, "k", claim(records, "k"), "paused at step 10") == 1
    assert records.cancel("k") == "cancelled"
    assert records.status("k").state.value == "cancelled"
