"""Which waiting job a worker's message starts (real Redis, the real records): the first of the queue's
order this worker can host; a job it cannot host never holds up the ones behind it, and is passed on
(its message, or another's: every waiting job keeps one out) once nothing here can start."""
from __future__ import annotations

import time

import pytest
import redis

from baton.schemas.settings import BatonSettings
from baton.schemas.spec import JobSpec
from baton.storage.layout import JobPaths
from baton.storage.records import leases, presence, refusals
from baton.storage.stores.open import open_store
from baton.workers.attempt.local import register_spec
from baton.storage.records.job_records import JobRecords, spec_fields
from baton.workers.queue.preemption import Preemption
from baton.workers.queue.reception import Choice, Passed, choices
from baton.workers.queue.worker_control import WorkerContext
from tests.helpers import make_spec

@pytest.fixture
def ctx(redis_server, tmp_path):
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushdb()
    (tmp_path / "store").mkdir()
    settings = BatonSettings(redis_url=redis_server.url, storage_url=f"file://{tmp_path}/store",
                             allowed_modules="tests.probes")
    ctx = WorkerContext(settings, client, JobRecords(client), lambda *a: None, Preemption(), "w@test")
    presence.announce(client, ctx.worker, ["default"], 30.0, ctx.offer, ctx.run)  # (as it does when it starts)
    return ctx


def submit(ctx: WorkerContext, job_id: str, spec: dict) -> None:
    parsed = JobSpec.parse(spec)
    register_spec(open_store(ctx.settings.storage_url), JobPaths(job_id), parsed)  # (as a submit writes it)
    assert ctx.records.create(job_id, spec_fields(parsed, ctx.settings.storage_url))
    time.sleep(0.002)


HOSTED = make_spec(model={"target": "tests.probes:linear", "kwargs": {}})
ELSEWHERE = make_spec(task={"target": "tests.tasks:dict_task", "kwargs": {}})  # tests.tasks: not allowed here


def test_a_job_this_worker_cannot_host_does_not_hold_up_the_one_behind_it(ctx):
    submit(ctx, "first", ELSEWHERE)
    submit(ctx, "second", HOSTED)
    offered = list(choices(ctx, "default", "first", 1))  # first's own message
    assert [(c.job_id, c.attempt) for c in offered if isinstance(c, Choice)] == [("second", 1)]
    assert isinstance(offered[-1], Passed) and offered[-1].job_id == "first"
    assert "module 'tests.tasks' is not allowed here" in offered[-1].why
    assert refusals.read(ctx.redis, ["first", "second"]) == {"first": {"w@test"}, "second": set()}  # the scheduler's


def test_a_message_whose_job_started_elsewhere_passes_on_a_waiting_job_nobody_here_can_host(ctx):
    """Without this the waiting job's own message was gone (taken by the worker that started the other)
    and nothing would wake a worker for it but the reaper's re-publish, minutes later once backed off."""
    submit(ctx, "elsewhere", ELSEWHERE)
    submit(ctx, "started", HOSTED)
    assert leases.claim(ctx.redis, "started", 1, "other@test", 30).ok
    offered = list(choices(ctx, "default", "started", 1))
    assert [c.job_id for c in offered if isinstance(c, Choice)] == ["started"]  # (its claim will drop it)
    assert offered[-1] == Passed("elsewhere", 1, offered[-1].why)


def test_the_message_of_a_job_running_elsewhere_passes_on_a_waiting_one_not_itself(ctx):
    """A CPU worker takes the message of a GPU job another worker already started: passing that job's
    message on would drop it (it no longer waits), leaving the GPU job that does wait without one."""
    submit(ctx, "running", ELSEWHERE)
    submit(ctx, "waiting", ELSEWHERE)
    assert leases.claim(ctx.redis, "running", 1, "other@test", 30).ok
    offered = list(choices(ctx, "default", "running", 1))
    assert [c.job_id for c in offered] == ["waiting"] and isinstance(offered[0], Passed)


def test_a_worker_serving_two_queues_starts_the_highest_priority_of_either_and_hands_the_message_back(ctx):
    """A worker of queues a and b takes a message of queue a: it starts b's priority-100 job first (a
    worker's slot is one slot), then a's in a's own order, and the message goes back to queue a (it
    stands for a job waiting there)."""
    from baton.workers.queue import intake

    published: list = []
    ctx.queues = ("a", "b")
    ctx.publish = lambda job_id, attempt, queue: published.append((job_id, attempt, queue))
    submit(ctx, "a-early", make_spec(**{**HOSTED, "resources": {**HOSTED["resources"], "queue": "a"}}))
    submit(ctx, "a-high", make_spec(**{**HOSTED, "resources": {**HOSTED["resources"], "queue": "a", "priority": 5}}))
    submit(ctx, "b-urgent", make_spec(**{**HOSTED, "resources": {**HOSTED["resources"], "queue": "b",
                                                                 "priority": 100}}))
    submit(ctx, "b-late", make_spec(**{**HOSTED, "resources": {**HOSTED["resources"], "queue": "b"}}))
    offered = [c.job_id for c in choices(ctx, "a", "a-early", 1)]
    assert offered == ["b-urgent", "a-high", "a-early", "b-late"]

    # the job it starts here holds a spec that does not read: the claim fails it at once (no training process)
    unreadable = spec_fields(JobSpec.parse(HOSTED), ctx.settings.storage_url)
    assert ctx.records.create("b-broken", {**unreadable, "spec": "{not json", "queue": "b", "priority": "1000"})
    assert intake.run_job(ctx, "a-early", 1, "a") == "failed"
    assert ctx.records.status("b-broken").state.value == "failed"
    assert published == [("a-early", 1, "a")]  # the message of queue a went back to queue a


def test_across_queues_a_team_below_its_quota_on_its_own_queue_starts_before_an_older_job(ctx):
    """The scheduler freed this worker (queues a and b) so that team y, below its quota on b, gets its slot:
    the worker starts y's job, not team x's older one of queue a (which would yield again a minute later,
    and again, while y's job never started)."""
    ctx.queues = ("a", "b")
    ctx.records.pool.set_quota("b", "y", 1)
    submit(ctx, "alow", make_spec(**{**HOSTED, "resources": {**HOSTED["resources"], "queue": "a", "team": "x"}}))
    submit(ctx, "bq", make_spec(**{**HOSTED, "resources": {**HOSTED["resources"], "queue": "b", "team": "y"}}))
    assert [c.job_id for c in choices(ctx, "a", "alow", 1)] == ["bq", "alow"]
