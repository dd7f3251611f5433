"""A multi-node job's gang against a real Redis: admitted all or nothing, distinct members, no
deadlock between two gangs of a queue, nothing used up by a gang that does not fill, and no leader
acting on a gang that is not its own."""
from __future__ import annotations

import time

import pytest
import redis

from baton.storage.records import keys
from baton.storage.records.job_records import JobRecords
from baton.storage.records import leases as lease, presence, reaping as reaper
from baton.storage.records.gangs import Gangs

from tests.workers.queue.test_reaper import new_job


@pytest.fixture
def env(redis_server):
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushdb()
    records = JobRecords(client)
    for job in ("a", "b"):
        new_job(records, job)
    return client, records, Gangs(client)


def form(gangs: Gangs, job: str, nodes: int, worker: str, host: str, queue: str = "default", attempt: int = 1,
         ttl_s: float = 5):
    status, led = gangs.form(job, queue, attempt, nodes, worker, host, ttl_s=ttl_s)
    assert status == "ok", status
    return led


def test_a_gang_is_admitted_once_every_node_has_joined_then_claims_as_any_job(env):
    client, records, gangs = env
    led = form(gangs, "a", 3, "w0", "h0")
    assert records.status("a").state.value == "queued"  # nothing claimed while it forms
    assert records.status("a").last_event == "waiting for nodes: 1 of 3 joined"
    first, why = gangs.join("a", 1, 3, "w1", "h1", "host", ttl_s=5)
    assert first is not None and first.node == 1 and first.gang == led.id and why == "ok"
    assert gangs.join("a", 1, 3, "w1", "h1", "host", ttl_s=5) == (None, "member")
    assert records.status("a").last_event == "waiting for nodes: 2 of 3 joined"
    assert gangs.join("a", 1, 3, "w9", "h1", "host", ttl_s=5) == (None, "same-host w1")  # one node a host
    assert gangs.admit(led) == ("forming", 2)
    assert records.status("a").last_event == ("waiting for nodes: 2 of 3 joined; w9 did not join: it is on the host "
                                              "of w1 (nodes are distinct hosts; BATON_GANG_DISTINCT)")
    second, _ = gangs.join("a", 1, 3, "w2", "h2", "host", ttl_s=5)
    assert second is not None and second.node == 2
    assert gangs.join("a", 1, 3, "w3", "h3", "host", ttl_s=5) == (None, "full")
    assert gangs.admit(led) == ("admitted", 3)
    assert records.status("a").last_event == "gang of 3 nodes admitted: w0, w1, w2 (the first leads)"
    assert not client.exists(keys.queue_forming("default"))  # the next gang may form now
    assert gangs.join("a", 1, 3, "w3", "h3", "host", ttl_s=5) == (None, "closed")

    assert lease.claim(client, "a", 1, "w0", ttl_s=5).ok  # the leader claims the attempt as any worker does
    assert gangs.start(led, "10.0.0.1:29400", "s3cret", '{"world_size": 3}')
    gang = gangs.read("a")
    assert (gang.state, gang.endpoint, gang.args, gang.workers, gang.hosts) == (
        "running", "10.0.0.1:29400", '{"world_size": 3}', {0: "w0", 1: "w1", 2: "w2"}, {0: "h0", 1: "h1", 2: "h2"})
    assert gangs.report("a", led.id, "lost", "node 2 was lost") and not gangs.report("a", led.id, "lost", "again")
    assert gangs.read("a").lost == "node 2 was lost"  # the first report stays


def test_workers_of_one_host_stand_for_nodes_only_where_told_to(env):
    _, _, gangs = env
    form(gangs, "a", 2, "w0@test", "box")
    assert gangs.join("a", 1, 2, "w1@test", "box", "host", ttl_s=5) == (None, "same-host w0@test")
    member, _ = gangs.join("a", 1, 2, "w1@test", "box", "worker", ttl_s=5)  # tests: one machine, two "nodes"
    assert member is not None and member.node == 1


def test_a_place_whose_follower_died_while_waiting_is_free_again(env):
    _, records, gangs = env
    led = form(gangs, "a", 2, "w0", "h0")
    dead, _ = gangs.join("a", 1, 2, "w1", "h1", "host", ttl_s=0.2)
    time.sleep(0.3)  # its lease lapsed: never renewed
    assert not gangs.renew_member("a", dead, ttl_s=5)
    alive, _ = gangs.join("a", 1, 2, "w1", "h1", "host", ttl_s=5)  # the same host, restarted: its place is free
    assert alive.node == 1 and gangs.renew_member("a", alive, ttl_s=5)
    assert gangs.admit(led) == ("admitted", 2)
    led = form(gangs, "b", 2, "w0", "h0")
    gangs.join("b", 1, 2, "w1", "h1", "host", ttl_s=0.2)
    time.sleep(0.3)
    assert gangs.admit(led) == ("forming", 1)  # the leader does not admit a gang with a lapsed follower
    assert records.status("b").last_event == "waiting for nodes: 1 of 2 joined"


def test_a_follower_may_leave_a_forming_gang(env):
    _, _, gangs = env
    led = form(gangs, "a", 2, "w0", "h0")
    member, _ = gangs.join("a", 1, 2, "w1", "h1", "host", ttl_s=5)
    assert gangs.leave("a", member)
    assert gangs.read("a").joined == 1 and gangs.admit(led) == ("forming", 1)


def test_two_gangs_of_a_queue_never_each_hold_part_of_it(env):
    """Two 2-node jobs, two workers: while a's gang forms, b's leader is refused (and passes its message
    on, freeing its worker), so the second worker joins a, which is admitted; then b forms."""
    _, _, gangs = env
    led = form(gangs, "a", 2, "w0", "h0")
    assert gangs.form("b", "default", 1, 2, "w1", "h1", ttl_s=5) == ("busy", None)
    assert gangs.busy_with("default") == "a"
    other = form(gangs, "b", 2, "w1", "h1", queue="other-queue")  # another queue: its own workers
    assert gangs.dissolve(other, "moved")
    assert gangs.join("a", 1, 2, "w1", "h1", "host", ttl_s=5)[0] is not None
    assert gangs.admit(led) == ("admitted", 2)
    form(gangs, "b", 2, "w2", "h2")  # the dissolved gang's record gives way


def test_a_gang_that_does_not_fill_is_dissolved_without_using_an_attempt(env):
    client, records, gangs = env
    led = form(gangs, "a", 3, "w0", "h0")
    member, _ = gangs.join("a", 1, 3, "w1", "h1", "host", ttl_s=5)
    assert gangs.dissolve(led, "waiting for nodes: only 2 of 3 joined in 30s")
    gang = gangs.read("a")
    assert gang.state == "dissolved" and gang.reason.startswith("waiting for nodes: only 2 of 3")
    assert gangs.admit(led) == ("closed", 0) and not gangs.renew(led, ttl_s=5)
    assert not client.exists(keys.queue_forming("default"))
    status = records.status("a")
    assert (status.state.value, status.attempt, status.lost) == ("queued", 0, 0)  # no attempt claimed or lost
    assert status.last_event.startswith("waiting for nodes: only 2 of 3")
    again = form(gangs, "a", 3, "w5", "h5")  # offered again
    assert again.id != led.id and gangs.read("a").workers == {0: "w5"}
    assert gangs.read("a").id != member.gang  # a follower of the dissolved gang sees it is not a member of this one


def test_a_leader_acts_only_on_its_own_gang(env):
    """A leader that stalled past its gang's life: another leader formed the gang of the same attempt
    since. The first one's renewal, admission, start and dissolution all leave the new gang alone."""
    _, _, gangs = env
    stale = form(gangs, "a", 2, "w0", "h0", ttl_s=0.2)
    time.sleep(0.3)
    fresh = form(gangs, "a", 2, "w1", "h1")
    gangs.join("a", 1, 2, "w2", "h2", "host", ttl_s=5)
    assert not gangs.renew(stale, ttl_s=5)
    assert gangs.admit(stale) == ("closed", 0)
    assert not gangs.dissolve(stale, "the stale leader's timeout")
    assert gangs.admit(fresh) == ("admitted", 2)
    assert not gangs.start(stale, "10.0.0.9:1", "wrong", "{}")
    assert gangs.start(fresh, "10.0.0.1:2", "right", "{}") and gangs.read("a").endpoint == "10.0.0.1:2"


def test_the_gang_of_an_earlier_attempt_gives_way_and_a_cancelled_job_forms_none(env):
    client, records, gangs = env
    led = form(gangs, "a", 2, "w0", "h0")
    gangs.join("a", 1, 2, "w1", "h1", "host", ttl_s=5)
    gangs.admit(led)
    assert lease.claim(client, "a", 1, "w0", ttl_s=0.2).ok
    gangs.start(led, "10.0.0.1:2", "s", "{}")  # running; then its leader dies, and the reaper re-queues it
    time.sleep(0.3)
    assert reaper.reap_once(client, lambda *m: None, records) == [("a", "requeue")]
    assert gangs.form("a", "default", 2, 2, "w2", "h2", ttl_s=5)[0] == "ok"  # attempt 2's, not a duplicate

    led = form(gangs, "b", 2, "w3", "h3", queue="q2")
    client.hset(keys.job("b"), "state", "cancelled")
    assert gangs.admit(led) == ("closed", 0)
    assert gangs.join("b", 1, 2, "w4", "h4", "host", ttl_s=5) == (None, "closed")


def test_a_stale_or_duplicate_message_forms_nothing(env):
    client, _, gangs = env
    assert gangs.form("a", "default", 2, 2, "w0", "h0", ttl_s=5) == ("stale", None)
    form(gangs, "a", 2, "w0", "h0")
    assert gangs.form("a", "default", 1, 2, "w1", "h1", ttl_s=5) == ("duplicate", None)
    assert lease.claim(client, "a", 1, "w0", ttl_s=5).ok
    assert gangs.form("a", "default", 1, 2, "w1", "h1", ttl_s=5) == ("state", None)


def test_a_leader_that_dies_while_forming_leaves_nothing_behind(env):
    """The gang and the queue's slot expire without the leader's renewals; the reaper, no longer held
    off by them, publishes the message again, and a new leader forms the gang."""
    client, records, gangs = env
    published = []
    led = form(gangs, "a", 2, "w0", "h0", ttl_s=0.3)
    gangs.join("a", 1, 2, "w1", "h1", "host", ttl_s=5)

    def reap() -> list:
        acted = reaper.reap_once(client, lambda *m: published.append(m), records, unclaimed_after_s=0.2)
        return [action for job, action in acted if job == "a"]

    for _ in range(4):  # the leader renews while it waits: the message is not published again
        assert gangs.renew(led, ttl_s=0.3)
        assert reap() == []
        time.sleep(0.1)
    time.sleep(0.5)  # the leader is gone: no renewals
    assert gangs.read("a") is None and not client.exists(keys.queue_forming("default"))
    assert not gangs.renew(led, ttl_s=0.3)
    assert reap() == ["republish"] and ("a", 1, "default") in published
    form(gangs, "a", 2, "w2", "h2")


def test_a_drained_follower_asks_its_running_job_to_yield_and_the_leader_hears_it(env):
    """``baton drain`` of a follower's worker: its next renewal asks the job to yield, the leader's lease
    renewal brings that back (the whole gang stops at one step), and nothing of it is left for the next
    attempt."""
    client, records, gangs = env
    led = form(gangs, "a", 2, "w0", "h0")
    member, _ = gangs.join("a", 1, 2, "w1", "h1", "host", ttl_s=5)
    presence.set_drained(client, "w1", True)
    assert not gangs.renew_member("a", member, ttl_s=5)  # drained while its gang forms: it leaves (its place freed)
    assert gangs.leave("a", member) and gangs.admit(led) == ("forming", 1)
    assert records.raw("a").get("yield_requested") is None  # not running yet: nothing to yield
    presence.set_drained(client, "w1", False)
    member, _ = gangs.join("a", 1, 2, "w1", "h1", "host", ttl_s=5)
    assert gangs.renew_member("a", member, ttl_s=5) and gangs.admit(led) == ("admitted", 2)
    presence.set_drained(client, "w1", True)
    held = lease.claim(client, "a", 1, "w0", ttl_s=5)
    assert held.ok and gangs.start(led, "10.0.0.1:29400", "s3cret", "{}")
    renew = lease.Renewer(client, "a", "w0")
    assert renew(held.token, 5000).yield_requested == ""  # the leader's own worker is not drained
    assert gangs.renew_member("a", member, ttl_s=5)
    assert renew(held.token, 5000).yield_requested == "drained (node 1, w1)"
    assert records.release("a", held.token, "drained (node 1, w1) on w0") > 0
    assert "yield_requested" not in records.raw("a")


def test_a_follower_undrained_before_its_leader_heard_of_it_leaves_its_job_training(env):
    """As with a leader's own drain: undrained before the leader's next renewal, the job does not yield;
    once the leader has read it, the yield goes ahead."""
    client, records, gangs = env
    led = form(gangs, "a", 2, "w0", "h0")
    member, _ = gangs.join("a", 1, 2, "w1", "h1", "host", ttl_s=5)
    assert gangs.renew_member("a", member, ttl_s=5) and gangs.admit(led) == ("admitted", 2)
    held = lease.claim(client, "a", 1, "w0", ttl_s=5)
    assert held.ok and gangs.start(led, "10.0.0.1:29400", "s3cret", "{}")
    renew = lease.Renewer(client, "a", "w0")
    presence.set_drained(client, "w1", True)
    assert gangs.renew_member("a", member, ttl_s=5)
    assert presence.set_drained(client, "w1", False) and not presence.drained(client, ["w1"])
    assert renew(held.token, 5000).yield_requested == ""  # withdrawn: the job trains on
    presence.set_drained(client, "w1", True)
    assert gangs.renew_member("a", member, ttl_s=5)
    assert renew(held.token, 5000).yield_requested == "drained (node 1, w1)"
    assert presence.set_drained(client, "w1", False)  # too late: the leader has read it
    assert renew(held.token, 5000).yield_requested == "drained (node 1, w1)"
    assert not presence.set_drained(client, "w1", False)  # (not drained: nothing to undo)
