"""A queue's lines against a real Redis, moved by the job state machine's own scripts: the start order
(priority, then the team furthest below its quota, then submit time), each team's slots in use, and
every way into and out of a line (submit, claim, release, a lost attempt, a lapsed lease, cancel,
resume, finish)."""
from __future__ import annotations

import time

import pytest
import redis

from baton.schemas.spec import JobSpec
from baton.schemas.status import JobState
from baton.storage.records import keys
from baton.storage.records import leases, presence, reaping
from baton.storage.records.job_records import JobRecords, spec_fields
from tests.helpers import make_spec


@pytest.fixture
def records(redis_server):
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushdb()
    return JobRecords(client)


def submit(records: JobRecords, job_id: str, priority: int = 0, team: str = "default", nodes: int = 1,
           queue: str = "default") -> None:
    spec = JobSpec.parse(make_spec(resources={"priority": priority, "team": team, "queue": queue}))
    fields = spec_fields(spec, "file:///tmp/x")
    fields["slots"] = str(nodes)
    assert records.create(job_id, fields)
    time.sleep(0.002)  # distinct submit times (ms)


def order(records: JobRecords, queue: str = "default") -> list[str]:
    return [w.job_id for w in records.pool.state(queue).waiting]


def claim(records: JobRecords, job_id: str, worker: str = "w", ttl_s: float = 30) -> str:
    attempt = int(records.raw(job_id)["attempt"]) + 1
    claimed = leases.claim(records.redis, job_id, attempt, worker, ttl_s)
    assert claimed.ok, claimed.reason
    return claimed.token


def test_records_written_by_hand_with_bad_numbers_do_not_break_the_queue(records):
    from baton.jobs.pool import queue_views

    submit(records, "good")
    submit(records, "bad")
    records.redis.hset(keys.job("bad"), mapping={"slots": "1.5", "created_at": "x", "attempt": "nan"})
    submit(records, "runner", team="t")
    claim(records, "runner")
    [running] = records.redis.hkeys(keys.queue_running("default"))
    records.redis.hset(keys.queue_running("default"), running, "t 1e20 1.5")  # slots, priority: not integers
    assert sorted(order(records)) == ["bad", "good"]
    assert records.status("good").position is not None
    [view] = queue_views(records, "default")
    assert set(view.reasons) == {"bad", "good"}


def test_a_job_cancelled_while_it_yields_ends_cancelled_not_back_in_line(records):
    submit(records, "y")
    token = claim(records, "y")
    assert records.cancel("y") == "requested"  # asked while its worker was stopping it for a yield
    assert records.release("y", token, "yielded to job u (priority 10) on w") == -2
    status = records.status("y")
    assert status.state is JobState.cancelled and "cancelled as it stopped" in status.last_event
    assert order(records) == [] and records.pool.state("default").usage.get("default", 0) == 0


def test_a_drained_worker_is_no_free_worker_in_the_reasons(records):
    from baton.jobs.pool import queue_views

    submit(records, "x1")
    for worker in ("w1", "w2"):
        presence.announce(records.redis, worker, ["default"], 5.0)
    presence.set_drained(records.redis, "w1", True)
    assert records.status("x1").waiting == "next to start: a free worker of queue default takes it within moments"
    presence.set_drained(records.redis, "w2", True)
    drained = "next to start: every worker serving queue default is drained (`baton undrain WORKER`)"
    assert records.status("x1").waiting == drained
    [view] = queue_views(records, "default")
    assert view.reasons["x1"] == drained


def test_the_start_order_is_priority_then_submit_time_and_a_claim_leaves_it(records):
    submit(records, "x1")
    submit(records, "x2", priority=5)
    submit(records, "x3")
    submit(records, "low", priority=-3)
    assert order(records) == ["x2", "x1", "x3", "low"]
    assert [records.status(j).position for j in ("x1", "x2", "x3")] == [2, 1, 3]
    assert records.status("x1").waiting is None  # no worker serves the queue: said once it has waited a while
    presence.announce(records.redis, "w", ["default"], 5.0)
    assert records.status("x1").waiting == "behind 1 job(s) of higher priority"
    assert records.status("x2").waiting == "next to start: a free worker of queue default takes it within moments"

    claim(records, "x1")  # a worker may start any waiting job: the line closes over it
    assert records.status("x2").waiting == "next to start: every worker serving queue default is busy"
    assert order(records) == ["x2", "x3", "low"]
    assert records.status("x1").position is None
    assert records.pool.usage("default") == {"default": 1}


def test_teams_below_their_quota_come_first_at_one_priority(records):
    records.pool.set_quota("default", "a", 1)
    records.pool.set_quota("default", "b", 1)
    for n in range(3):
        submit(records, f"a{n}", team="a")
    for n in range(3):
        submit(records, f"b{n}", team="b")
    # nothing runs: a and b alternate, each counted as using what the jobs before it would
    assert order(records) == ["a0", "b0", "a1", "b1", "a2", "b2"]
    claim(records, "a0")
    claim(records, "a1")  # team a borrows: 2 slots on a quota of 1
    assert records.pool.usage("default") == {"a": 2}
    assert records.pool.counts("default") == (4, 2)  # (waiting, slots held): what Prometheus and KEDA read
    assert order(records) == ["b0", "b1", "a2", "b2"]
    presence.announce(records.redis, "w", ["default"], 5.0)
    assert records.status("a2").waiting == "team a is at its quota of 1 slot(s)"
    assert records.status("b1").waiting.startswith("behind 1 job(s) of priority 0")

    submit(records, "urgent", priority=1, team="a")  # priority still comes first
    assert order(records)[0] == "urgent"


def test_a_team_without_a_quota_is_ordered_by_its_use_and_multi_node_jobs_count_their_slots(records):
    submit(records, "big", team="a", nodes=3)
    submit(records, "a1", team="a")
    submit(records, "b1", team="b")
    claim(records, "big")
    assert records.pool.usage("default") == {"a": 3}
    assert order(records) == ["b1", "a1"]


def test_every_way_out_of_running_gives_the_slots_back_and_every_way_back_rejoins_the_line(records):
    client = records.redis
    publish_calls = []
    submit(records, "j", team="t")
    token = claim(records, "j")
    assert records.release("j", token, "preempted") == 2  # an uncounted release
    assert order(records) == ["j"] and records.pool.usage("default") == {}

    token = claim(records, "j")
    assert records.release_lost("j", token, "hung", "") == 3  # a counted loss, retried
    assert order(records) == ["j"] and records.pool.usage("default") == {}

    claim(records, "j", ttl_s=0.1)
    time.sleep(0.2)
    assert reaping.reap_once(client, lambda *a: publish_calls.append(a), records) == [("j", "requeue")]
    assert order(records) == ["j"] and records.pool.usage("default") == {}

    assert records.cancel("j") == "cancelled"
    assert order(records) == []
    assert records.resume("j") > 0
    assert order(records) == ["j"]
    token = claim(records, "j")
    assert records.finish("j", token, JobState.succeeded)
    assert order(records) == [] and records.pool.usage("default") == {} and client.hlen(keys.queue_running("default")) == 0


def test_a_line_entry_whose_job_no_longer_waits_is_dropped_when_read(records):
    submit(records, "gone")
    submit(records, "kept")
    records.redis.delete(keys.job("gone"))  # a record deleted by hand
    assert order(records) == ["kept"]
    assert records.redis.zcard(keys.queue_waiting("default", "default")) == 1


def test_a_waiting_record_from_before_lines_existed_joins_its_line_at_the_reapers_pass(records):
    submit(records, "old")
    records.redis.delete(keys.queue_waiting("default", "default"))
    assert order(records) == []
    reaping.reap_once(records.redis, lambda *a: None, records)
    assert order(records) == ["old"]


def test_queues_are_separate(records):
    submit(records, "g1", queue="gpu")
    submit(records, "c1")
    assert order(records, "gpu") == ["g1"] and order(records) == ["c1"]
    assert records.pool.queues() == ["default", "gpu"]


def test_a_running_job_with_no_known_total_leaves_the_estimate_unknown_and_the_status_whole(records):
    """A stream job knows no total step count: an older worker recorded it as the text 'None'."""
    submit(records, "stream")
    submit(records, "next")
    token = claim(records, "stream")
    assert records.fenced_set("stream", token, {"step": 10, "total_steps": None, "steps_per_s": 5.0})
    presence.announce(records.redis, "w", ["default"], 5.0)
    status = records.status("next")
    assert status.position == 1 and status.starts_in_s is None


def test_a_job_that_yielded_reads_queued_yielded_and_one_that_lost_its_worker_retrying(records):
    from baton.jobs.display import details, table

    submit(records, "y")
    token = claim(records, "y")
    assert records.release("y", token, "yielded to job u (priority 10) on w") == 2
    status = records.status("y")
    assert (status.state, status.yielded, status.shown_state) == (JobState.retrying, True, "queued (yielded)")
    assert "queued (yielded)" in table([status]) and "state: queued (yielded)" in details(status)
    token = claim(records, "y", ttl_s=0.05)  # claimed again: the mark goes; then its worker is lost
    assert not records.status("y").yielded
    time.sleep(0.1)
    reaping.reap_once(records.redis, lambda *args: None, records)
    assert records.status("y").shown_state == "retrying"
    token = claim(records, "y")
    assert records.release("y", token, "storage unavailable on w", yielded=False) == 4  # its store away: no yield
    assert records.status("y").shown_state == "retrying"
