"""A job's events and live points against a real Redis, written by the state machine's own scripts:
what the dashboard's timeline draws (its gaps without a worker and the steps redone) must tell the truth,
a loss right after a claim included."""
from __future__ import annotations

import time

import pytest
import redis

from baton.dashboard.timeline import timeline
from baton.storage.records import events, keys, leases, reaping
from baton.storage.records.job_records import JobRecords
from baton.storage.records.priority import set_priority
from tests.storage.test_pool import claim, submit


@pytest.fixture
def records(redis_server):
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushdb()
    return JobRecords(client)


def report(records: JobRecords, token: str, step: int, loss: float = 0.5) -> None:
    """A worker's renewal carrying its progress (as its heartbeat sends it)."""
    assert leases.Renewer(records.redis, "j", "w")(token, 30_000, {"step": step, "loss": loss, "lr": 0.01}).held


def lose(records: JobRecords) -> None:
    """The worker is gone: its lease is gone (as a lapsed one is, without waiting for it) and a reaper's
    pass finds it."""
    records.redis.delete(keys.lease("j"))
    records.redis.zadd(keys.LEASES_DUE, {"j": 0})
    assert reaping.reap_once(records.redis, lambda *a: None, records) == [("j", "requeue")]


def kinds(records: JobRecords) -> list[str]:
    return [event.kind for event in events.events(records.redis, "j")]


def test_a_loss_right_after_a_claim_counts_from_that_claim_not_the_previous_attempts_report(records):
    submit(records, "j")
    token = claim(records, "j", ttl_s=30)
    for step in (10, 20, 36):
        report(records, token, step)
    lose(records)
    events.add(records.redis, "j", "resumed", "resumed from its checkpoint at step 30", 30)  # (attempt 2's start)
    claim(records, "j")  # attempt 2: lost before it reports anything
    time.sleep(0.3)
    lose(records)
    claim(records, "j")
    rows = timeline(events.events(records.redis, "j"))
    assert [row["kind"] for row in rows] == ["submitted", "claimed", "lost", "resumed", "claimed", "lost", "claimed"]
    first_loss, second_loss = rows[2], rows[5]
    assert first_loss["step"] == 36 and first_loss["heard"] is not None
    assert second_loss["step"] is None, second_loss  # attempt 2 reported no step: not attempt 1's
    assert second_loss["heard"] >= rows[4]["t"]  # ...and was last heard of at its claim, not before it
    assert rows[6]["gap_s"] < 0.3 + 5  # the job was without a worker from attempt 2's loss, not attempt 1's
    assert rows[6]["gap_s"] <= rows[6]["t"] - rows[4]["t"] + 0.001  # (times kept to the millisecond)
    assert rows[3]["redone"] == 6  # 36 reported, resumed at 30


def test_client_events_carry_no_worker_and_a_cancel_ends_a_wait(records):
    submit(records, "j")
    token = claim(records, "j")
    report(records, token, 5)
    assert records.release("j", token, "preempted") > 0
    assert set_priority(records.redis, "j", 4) == "ok"
    assert records.cancel("j") == "cancelled"
    assert records.resume("j") > 0
    claim(records, "j")
    rows = timeline(events.events(records.redis, "j"))
    assert [row["kind"] for row in rows] == ["submitted", "claimed", "yielded", "priority", "cancelled", "requeued",
                                             "claimed"]
    for row in rows[3:6]:  # the client's own acts: no worker's name, no step
        assert row["worker"] == "" and row["step"] is None, row
    assert rows[6]["after"] == "requeued" and rows[6]["gap_s"] < rows[6]["t"] - rows[2]["t"]
    assert records.redis.exists("baton:job:j:live") == 0  # a cancelled job's live points go with it


def test_a_renewal_adds_a_live_point_only_when_its_step_moved_and_a_resume_drops_those_past_it(records):
    submit(records, "j")
    token = claim(records, "j", ttl_s=30)
    renew = leases.Renewer(records.redis, "j", "w")
    for step in (10, 20, 20, 36):
        report(records, token, step, loss=step / 100)
    assert renew(token, 30_000).held  # (a renewal without progress adds nothing)
    assert renew(token, 30_000, {"step": 40}).held  # (a step alone: the record's loss goes with it)
    points = events.live_points(records.redis, "j")
    assert [(p["step"], p["loss"], p["lr"]) for p in points] == [(10, 0.1, 0.01), (20, 0.2, 0.01), (36, 0.36, 0.01),
                                                                  (40, 0.36, 0.01)]
    assert all(p["time"] > 0 for p in points)
    events.add(records.redis, "j", "resumed", "resumed from its checkpoint at step 30", 30)
    report(records, token, 36, loss=0.35)  # redone after the resume: its point is back
    assert [p["step"] for p in events.live_points(records.redis, "j")] == [10, 20, 36]


def test_the_live_points_stay_capped(records):
    submit(records, "j")
    token = claim(records, "j", ttl_s=30)
    records.redis.rpush(keys.job_live("j"), *(f"{step} 0.5 0.01 1.0" for step in range(events.LIVE_POINTS_KEPT)))
    report(records, token, events.LIVE_POINTS_KEPT)
    points = events.live_points(records.redis, "j")
    assert len(points) == events.LIVE_POINTS_KEPT and (points[0]["step"], points[-1]["step"]) == (1, events.LIVE_POINTS_KEPT)
