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
def pool(redis_server) -> tuple[redis.Redis, JobRecords]:
    """A flushed Redis and its records."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushdb()
    return client, JobRecords(client)


def live(client: redis.Redis, *workers: str, queues: tuple[str, ...] = ("default",), **offer) -> None:
    """``workers`` serve ``queues`` (their run: ``<worker>-1``), offering ``offer`` (WorkerOffer's fields)."""
    from baton.schemas.hosting import WorkerOffer

    for worker in workers:
        presence.announce(client, worker, list(queues), 30.0, WorkerOffer(**offer), f"{worker}-1")


@pytest.fixture
def marked(pool):
    """'low' (priority 0) runs on the queue's one worker; 'urgent' (priority 10) waits: the turn marks 'low'."""
    client, records = pool
    live(client, "w1")
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


def test_no_worker_is_freed_for_a_job_it_said_it_cannot_host(pool):
    """'lowest' runs on w2, which said it cannot host 'urgent' (too few GPUs, say): 'low' on w1 yields
    instead; once both said no, nothing yields for it (it would start nowhere)."""
    client, records = pool
    for worker, job, priority in (("w1", "low", 0), ("w2", "lowest", -5)):
        live(client, worker)
        submit(records, job, priority=priority)
        claim(records, job, worker=worker)
    submit(records, "urgent", priority=10)
    refusals.note(client, "urgent", "w2", "w2-1")
    assert [(one.job_id, one.for_job) for one in Scheduler(client).turn()] == [("low", "urgent")]
    client.delete(keys.queue_yielding("default"))
    client.hdel(keys.job("low"), "yield_marked_at")
    client.zrem(keys.queue_cooling("default"), "low")  # (the cooldown over)
    refusals.note(client, "urgent", "w1", "w1-1")
    assert Scheduler(client).turn() == []
    submit(records, "urgent2", priority=10)  # a job behind it that w1 can host still gets a worker freed
    assert [(one.job_id, one.for_job) for one in Scheduler(client).turn()] == [("lowest", "urgent2")]


@pytest.mark.parametrize("other", ["busy", "drained"])
def test_a_job_behind_one_a_worker_cannot_host_still_gets_that_worker_freed(pool, other):
    """W1 (priority 5) waits; 'low' runs on A, which said no to W1; B, which never said no (busy since
    before W1, or drained: neither reads the queue), cannot be freed for it. W2 (priority 3) behind it
    can run on A: A is freed for W2 (freed, it skips W1 and starts W2)."""
    client, records = pool
    live(client, "A", "B")
    submit(records, "low", priority=0)
    claim(records, "low", worker="A")
    if other == "busy":
        submit(records, "high", priority=20)
        claim(records, "high", worker="B")
    else:
        presence.set_drained(client, "B", True)
    submit(records, "W1", priority=5)
    submit(records, "W2", priority=3)
    refusals.note(client, "W1", "A", "A-1")
    assert [(one.job_id, one.for_job) for one in Scheduler(client).turn()] == [("low", "W2")]


def test_a_worker_that_can_host_the_job_now_takes_back_its_no(pool):
    """A worker restarted under its name with more GPUs (say) finds it can host the job: its "no" goes."""
    import types

    from baton.workers.queue import reception

    client, _ = pool
    refusals.note(client, "W", "A", "A-1")
    refusals.note(client, "W", "B", "B-1")
    live(client, "A", "B")
    ctx = types.SimpleNamespace(redis=client, worker="A", run="A-1")
    view = reception.JobView(spec=None, spec_error=None, storage_url=None, queue="default")  # (no spec: it can)
    assert reception.refusal(ctx, "W", view) is None
    assert refusals.read(client, ["W"]) == {"W": {"B"}}


def test_a_no_holds_while_its_worker_runs_and_goes_when_it_restarts(pool):
    client, _ = pool
    live(client, "A", "B")
    refusals.note(client, "W", "A", "A-1")
    refusals.note(client, "W", "B", "B-0")  # said in an earlier run of B
    assert refusals.read(client, ["W"]) == {"W": {"A"}}
    presence.announce(client, "A", ["default"], 30.0, run="A-2")  # A restarted (with more GPUs, perhaps)
    assert refusals.read(client, ["W"]) == {"W": frozenset()}


def test_an_idle_worker_that_said_no_is_no_free_slot_for_the_job(pool):
    """A is idle but said no to 'urgent' (too few GPUs, say); 'low' runs on B: 'low' yields for it."""
    client, records = pool
    live(client, "A", "B")
    submit(records, "low", priority=0)
    claim(records, "low", worker="B")
    submit(records, "urgent", priority=10)
    refusals.note(client, "urgent", "A", "A-1")
    assert [(one.job_id, one.for_job) for one in Scheduler(client).turn()] == [("low", "urgent")]
    refusals.withdraw(client, "urgent", "A")
    client.delete(keys.queue_yielding("default"))
    client.hdel(keys.job("low"), "yield_marked_at")
    client.zrem(keys.queue_cooling("default"), "low")  # (the cooldown over)
    assert Scheduler(client).turn() == []  # A may start it: nothing yields


def test_a_gang_follower_that_once_said_no_is_not_taken_for_an_idle_worker(pool):
    """'g' runs on two nodes: w0 leads (BUSY names it), w1 follows (it looks idle) and said no to
    'urgent' before it joined; w2 is idle and can host 'urgent': nothing yields, w2 takes it."""
    from baton.storage.records.gangs import Gangs

    client, records = pool
    gangs = Gangs(client)
    live(client, "w0", "w1", "w2", "w3")
    submit(records, "g", nodes=2)
    _, led = gangs.form("g", "default", 1, 2, "w0", "h0", ttl_s=30)
    gangs.join("g", 1, 2, "w1", "h1", "host", ttl_s=30)
    assert gangs.admit(led) == ("admitted", 2)
    claim(records, "g", worker="w0")
    assert gangs.start(led, "127.0.0.1:1", "s", "{}")
    submit(records, "low", priority=-1)
    claim(records, "low", worker="w3")
    submit(records, "urgent", priority=10)
    refusals.note(client, "urgent", "w1", "w1-1")
    assert Scheduler(client).turn() == []
    claim(records, "urgent", worker="w2")  # (w2 took it)
    submit(records, "urgent2", priority=10)
    refusals.note(client, "urgent2", "w1", "w1-1")  # the follower is no idle worker: 'low' yields for this one
    assert [(one.job_id, one.for_job) for one in Scheduler(client).turn()] == [("low", "urgent2")]


def running(pool, *jobs: tuple[str, str]) -> None:
    """Each (job, worker) of ``jobs`` runs on its live worker, at priority 0; 'urgent' (priority 10) waits."""
    client, records = pool
    for job, worker in jobs:
        live(client, worker)
        submit(records, job)
        claim(records, job, worker=worker)
    submit(records, "urgent", priority=10)


def test_a_job_asked_to_yield_is_not_asked_again_within_the_cooldown_even_after_it_ran_again(pool):
    """'low' yielded to 'urgent' and runs again on a freed worker; 'urgent2' arrives: 'other' yields, not
    'low' again (the queue's cooling index, not the record, is what the turn reads)."""
    client, records = pool
    running(pool, ("low", "w1"), ("other", "w2"))
    assert [one.job_id for one in Scheduler(client).turn()] == ["low"]
    assert records.release("low", client.get(keys.lease("low")), "yielded") > 0  # (the yield, carried out)
    claim(records, "urgent", worker="w1")
    claim(records, "low", worker="w3")
    live(client, "w3")
    submit(records, "urgent2", priority=10)
    assert [one.job_id for one in Scheduler(client).turn()] == ["other"]


def test_a_turn_while_a_job_waits_costs_the_same_few_commands_however_many_jobs_run(pool):
    """The scheduler's turn reads the queue's hashes and sets whole (a command each), never each
    running job's record: with 60 running jobs, a turn stays within a fixed number of commands."""
    client, records = pool
    for i in range(60):
        live(client, f"w{i}")
        submit(records, f"r{i}", priority=5)
        claim(records, f"r{i}", worker=f"w{i}")
    submit(records, "waits", priority=0)  # (lower than every running job: nothing yields, it just waits)
    scheduler = Scheduler(client)
    before = sum(int(stat["calls"]) for stat in client.info("commandstats").values())
    assert scheduler.turn() == []
    spent = sum(int(stat["calls"]) for stat in client.info("commandstats").values()) - before - 1  # (the INFO)
    assert spent <= 30, spent


def test_a_job_in_its_cooldown_but_missing_from_the_index_is_listed_by_the_refused_mark(pool):
    """A mark the cooling index does not list (made before the index, or pruned by a turn whose clock ran
    ahead): the mark script refuses the job and lists it, so the next turn asks another one."""
    client, records = pool
    running(pool, ("a-low", "w1"), ("b-low", "w2"))
    redis_now = float(client.time()[0])
    client.hset(keys.job("a-low"), "yield_marked_at", redis_now - 5)  # asked 5 s ago; the index knows nothing
    scheduler = Scheduler(client)
    assert scheduler.turn() == []  # a-low refused by the script...
    assert [one.job_id for one in scheduler.turn()] == ["b-low"]  # ...and passed over from then on


def test_a_worker_serving_two_queues_is_one_slot_a_higher_priority_of_either_takes(pool):
    """w serves a and b and runs 'low' of queue a (priority 0); 'urgent' of queue b (priority 100) waits:
    b's turn asks 'low' to yield (marked on a, its own queue), and the status says why it waits."""
    client, records = pool
    live(client, "w", queues=("a", "b"))
    submit(records, "low", queue="a")
    claim(records, "low", worker="w")
    submit(records, "urgent", priority=100, queue="b")
    assert records.status("urgent").waiting == "next to start: every worker serving queue b is busy"
    [one] = Scheduler(client).turn()
    assert (one.job_id, one.for_job, one.reason) == ("low", "urgent", "yielded to job urgent (priority 100)")
    assert client.hkeys(keys.queue_yielding("a")) == ["low"] and not client.exists(keys.queue_yielding("b"))
    assert Scheduler(client).turn() == []  # its slot counts as freed: nothing else yields for it


def test_a_job_of_another_queue_within_its_quota_there_is_not_taken_by_a_reclaim(pool):
    """Quotas stay each queue's own: 'a1' runs within team x's quota on queue a, on a worker that serves
    b too; team y, below its quota on b, waits at the same priority: nothing is reclaimed. Beyond x's
    quota on a, 'a1' is borrowed, and y reclaims it."""
    client, records = pool
    live(client, "w", queues=("a", "b"))
    records.pool.set_quota("a", "x", 1)
    records.pool.set_quota("b", "y", 1)
    submit(records, "a1", team="x", queue="a")
    claim(records, "a1", worker="w")
    submit(records, "b1", team="y", queue="b")
    assert Scheduler(client).turn() == []
    records.pool.set_quota("a", "x", 0)
    [one] = Scheduler(client).turn()
    assert (one.job_id, one.kind, one.reason) == ("a1", "reclaim", "team x's slot reclaimed by team y")


def test_a_job_no_live_worker_can_host_frees_nobody_and_says_what_none_offers(pool):
    """Both workers are busy and run no shipped code: a job that ships its code (priority 10) frees neither,
    however long it waits, and its status says why. A worker that runs shipped code, busy too, is freed."""
    from baton.schemas.spec import JobSpec
    from baton.storage.records.job_records import spec_fields
    from tests.helpers import make_spec

    client, records = pool
    live(client, "w1", "w2")
    for worker, job in (("w1", "low"), ("w2", "lower")):
        submit(records, job)
        claim(records, job, worker=worker)
    shipping = JobSpec.parse(make_spec(resources={"priority": 10}, code={"digest": "sha256:" + "0" * 64}))
    assert records.create("shipper", spec_fields(shipping, "file:///tmp/x"))
    assert Scheduler(client).turn() == []
    said = "no live worker of queue default accepts shipped code (BATON_ACCEPT_CODE)"
    assert records.status("shipper").waiting == said
    from baton.jobs.pool import queue_views
    assert queue_views(records, "default")[0].reasons["shipper"] == said
    assert records.status("shipper").starts_in_s is None  # (nothing can start it: no estimate)
    submit(records, "plain")  # behind it in line, but nothing holds it up: it is next to start
    assert records.status("plain").waiting == "next to start: every worker serving queue default is busy"

    live(client, "w2", accepts_code=True)  # (w2 restarted with BATON_ACCEPT_CODE on, still running 'lower')
    assert [(one.job_id, one.for_job) for one in Scheduler(client).turn()] == [("lower", "shipper")]
    assert records.status("shipper").waiting == "next to start: every worker serving queue default is busy"
    presence.set_drained(client, "w2", True)  # the one that could host it drained: what to do is said
    assert records.status("shipper").waiting == f"{said}; 1 drained worker(s) do (`baton undrain WORKER`)"
