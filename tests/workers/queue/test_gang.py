"""A multi-node job's gang against a real Redis: admitted all or nothing, distinct members, no
deadlock between two gangs, nothing used up by a gang that does not fill."""
from __future__ import annotations

import time

import pytest
import redis

from baton.jobs import keys
from baton.jobs.records import JobRecords
from baton.workers.queue import lease, reaper
from baton.workers.queue.gang import Gangs

from tests.workers.queue.test_reaper import new_job


@pytest.fixture
def env(redis_server):
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushdb()
    records = JobRecords(client)
    for job in ("a", "b"):
        new_job(records, job)
    return client, records, Gangs(client)


def test_a_gang_is_admitted_once_every_node_has_joined_then_claims_as_any_job(env):
    client, records, gangs = env
    assert gangs.form("a", "default", 1, 3, "w0", "h0", timeout_s=30, ttl_s=5) == ("ok", None)
    assert records.status("a").state.value == "queued"  # nothing claimed while it forms
    assert records.status("a").last_event == "waiting for nodes: 1 of 3 joined"
    first, why = gangs.join("a", 1, 3, "w1", "h1", "host", ttl_s=5)
    assert first is not None and first.node == 1 and why == "ok"
    assert gangs.join("a", 1, 3, "w1", "h1", "host", ttl_s=5) == (None, "member")
    assert gangs.join("a", 1, 3, "w9", "h1", "host", ttl_s=5) == (None, "same-host w1")  # one node a host
    assert records.status("a").last_event == "waiting for nodes: 2 of 3 joined"
    assert gangs.admit("a", "default", 1, 3) == ("forming", 2)
    second, _ = gangs.join("a", 1, 3, "w2", "h2", "host", ttl_s=5)
    assert second is not None and second.node == 2
    assert gangs.join("a", 1, 3, "w3", "h3", "host", ttl_s=5)[1] == "full"
    assert gangs.admit("a", "default", 1, 3) == ("admitted", 3)
    assert not client.exists(keys.queue_forming("default"))  # the next gang may form now
    assert gangs.join("a", 1, 3, "w3", "h3", "host", ttl_s=5) == (None, "closed")

    assert lease.claim(client, "a", 1, "w0", ttl_s=5).ok  # the leader claims the attempt as any worker does
    assert gangs.start("a", 1, "10.0.0.1:29400", "s3cret")
    gang = gangs.read("a")
    assert (gang.state, gang.endpoint, gang.workers, gang.hosts) == (
        "running", "10.0.0.1:29400", {0: "w0", 1: "w1", 2: "w2"}, {0: "h0", 1: "h1", 2: "h2"})


def test_workers_of_one_host_stand_for_nodes_only_where_told_to(env):
    _, _, gangs = env
    gangs.form("a", "default", 1, 2, "w0@test", "box", timeout_s=30, ttl_s=5)
    assert gangs.join("a", 1, 2, "w1@test", "box", "host", ttl_s=5) == (None, "same-host w0@test")
    member, _ = gangs.join("a", 1, 2, "w1@test", "box", "worker", ttl_s=5)  # tests: one machine, two "nodes"
    assert member is not None and member.node == 1


def test_a_follower_that_died_while_waiting_is_dropped_and_its_place_offered_again(env):
    _, records, gangs = env
    gangs.form("a", "default", 1, 2, "w0", "h0", timeout_s=30, ttl_s=5)
    dead, _ = gangs.join("a", 1, 2, "w1", "h1", "host", ttl_s=0.2)
    time.sleep(0.3)  # its lease lapsed: never renewed
    assert gangs.admit("a", "default", 1, 2) == ("forming", 1)
    assert records.status("a").last_event == "waiting for nodes: 1 of 2 joined"
    assert not gangs.renew_member("a", dead, ttl_s=5)
    alive, _ = gangs.join("a", 1, 2, "w2", "h2", "host", ttl_s=5)
    assert alive.node == 1 and gangs.renew_member("a", alive, ttl_s=5)
    assert gangs.admit("a", "default", 1, 2) == ("admitted", 2)


def test_a_follower_may_leave_a_forming_gang(env):
    _, _, gangs = env
    gangs.form("a", "default", 1, 2, "w0", "h0", timeout_s=30, ttl_s=5)
    member, _ = gangs.join("a", 1, 2, "w1", "h1", "host", ttl_s=5)
    assert gangs.leave("a", 1, member)
    assert gangs.read("a").joined == 1 and gangs.admit("a", "default", 1, 2) == ("forming", 1)


def test_two_gangs_never_each_hold_part_of_the_pool(env):
    """Two 2-node jobs, two workers: while a's gang forms, b's leader is refused (and would pass its
    message on, freeing its worker), so the second worker joins a, which is admitted; then b forms."""
    _, _, gangs = env
    assert gangs.form("a", "default", 1, 2, "w0", "h0", timeout_s=30, ttl_s=5) == ("ok", None)
    assert gangs.form("b", "default", 1, 2, "w1", "h1", timeout_s=30, ttl_s=5) == ("busy", "a:1")
    assert gangs.form("b", "other-queue", 1, 2, "w1", "h1", timeout_s=30, ttl_s=5) == ("ok", None)  # its own pool
    assert gangs.dissolve("b", "other-queue", 1, "moved")
    assert gangs.join("a", 1, 2, "w1", "h1", "host", ttl_s=5)[0] is not None
    assert gangs.admit("a", "default", 1, 2) == ("admitted", 2)
    assert gangs.form("b", "default", 1, 2, "w2", "h2", timeout_s=30, ttl_s=5) == ("ok", None)


def test_a_gang_that_does_not_fill_is_dissolved_without_using_an_attempt(env):
    client, records, gangs = env
    gangs.form("a", "default", 1, 3, "w0", "h0", timeout_s=30, ttl_s=5)
    member, _ = gangs.join("a", 1, 3, "w1", "h1", "host", ttl_s=5)
    assert gangs.dissolve("a", "default", 1, "waiting for nodes: only 2 of 3 joined in 30s")
    gang = gangs.read("a")
    assert gang.state == "dissolved" and gang.reason.startswith("waiting for nodes: only 2 of 3")
    assert gangs.admit("a", "default", 1, 3) == ("closed", 0)
    assert not client.exists(keys.queue_forming("default"))
    status = records.status("a")
    assert (status.state.value, status.attempt, status.lost) == ("queued", 0, 0)  # no attempt claimed or lost
    assert status.last_event.startswith("waiting for nodes: only 2 of 3")
    assert gangs.form("a", "default", 1, 3, "w5", "h5", timeout_s=30, ttl_s=5) == ("ok", None)  # offered again
    again = gangs.read("a")
    assert again.state == "forming" and again.id != gang.id and again.workers == {0: "w5"}
    assert again.id != member.gang  # a follower of the dissolved gang sees it is not a member of this one


def test_a_stale_or_duplicate_message_forms_nothing(env):
    client, _, gangs = env
    assert gangs.form("a", "default", 2, 2, "w0", "h0", timeout_s=30, ttl_s=5) == ("stale", None)
    assert gangs.form("a", "default", 1, 2, "w0", "h0", timeout_s=30, ttl_s=5) == ("ok", None)
    assert gangs.form("a", "default", 1, 2, "w1", "h1", timeout_s=30, ttl_s=5) == ("duplicate", None)
    assert lease.claim(client, "a", 1, "w0", ttl_s=5).ok
    assert gangs.form("a", "default", 1, 2, "w1", "h1", timeout_s=30, ttl_s=5) == ("state", "running")


def test_a_leader_that_dies_while_forming_leaves_nothing_behind(env):
    """The gang expires without its leader's renewals; the reaper, no longer held off by them,
    publishes the message again, and a new leader forms the gang."""
    client, records, gangs = env
    published = []
    gangs.form("a", "default", 1, 2, "w0", "h0", timeout_s=0.5, ttl_s=0.3)
    member, _ = gangs.join("a", 1, 2, "w1", "h1", "host", ttl_s=5)
    def reap() -> list:
        acted = reaper.reap_once(client, lambda *m: published.append(m), records, unclaimed_after_s=0.2)
        return [action for job, action in acted if job == "a"]

    for _ in range(4):  # the leader renews while it waits: the message is not published again
        assert gangs.renew("a", 1, ttl_s=0.3)
        assert reap() == []
        time.sleep(0.1)
    time.sleep(0.6)  # the leader is gone: no renewals
    assert gangs.read("a") is None and not client.exists(keys.queue_forming("default"))
    assert not gangs.renew("a", 1, ttl_s=0.3)
    assert reap() == ["republish"] and ("a", 1, "default") in published
    assert gangs.form("a", "default", 1, 2, "w2", "h2", timeout_s=30, ttl_s=5) == ("ok", None)
