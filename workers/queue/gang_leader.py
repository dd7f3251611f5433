"""A multi-node job's leader: the worker that took the message of its next attempt (``gang_follower``
holds the other nodes' part; ``baton.storage.records.gangs`` forms the gang in Redis).

The leader forms the gang,
publishes N-1 join messages to the job's queue and waits until the gang is admitted, renewing it
meanwhile. Only then does it claim the attempt and run it as any job, with a ``Leadership``: its rank
0 serves the rendezvous (a TCP store on a free port of ``node_address``) and publishes it, with the
attempt's secret and the ranks' order, in the gang's record (``announce``: the training process's
peers call it, ``baton.workers.parallel.nodes.LeaderPeers``). A gang that does not fill within
``gang_timeout_s`` is dissolved and its message passed on: no attempt is claimed. However the
attempt ends, the leader dissolves its gang, and every follower's ranks are killed.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Callable, Optional, Protocol

import redis

from baton.schemas.errors import BatonError
from baton.schemas.messages import AttemptOrder, GroupOrder
from baton.storage.records.gangs import Gang, Gangs, Led
from baton.workers.parallel.errors import NodeReleased, RankFailed, RankLost
from baton.workers.queue.gang_node import POLL_S, Renewer, node_address, node_host, quietly

_log = logging.getLogger("baton.worker")

REOFFER_S = 30.0
"""While a forming gang misses places and no place was offered for this long, the leader offers the
missing places again: a join message taken by a worker that was then SIGKILLed is gone unseen."""
REPORT_WAIT_S = 3.0
"""How long the leader's rank 0, its collective broken, waits for another node's report of why (a
follower reports within WATCH_S + SETTLE_S of its rank's end) before it counts the attempt lost.
Waiting for a dead follower's lease to lapse instead would add up to a lease TTL to every recovery."""


class OrderRefused(BatonError):
    """The ranks' order a leader's training process asked to publish is not its attempt's."""


def matching_order(order: str, attempt: AttemptOrder) -> GroupOrder:
    """``order`` as a GroupOrder, if it is ``attempt``'s: the same job, attempt, spec, store and allowed
    modules, and a checkpoint to resume from among the job's own objects; ``OrderRefused`` otherwise."""
    try:
        group = GroupOrder.model_validate_json(order)
    except ValueError as exc:
        raise OrderRefused(f"the ranks' order is not one: {exc}") from None
    own = f"jobs/{attempt.job_id}/"
    wrong = [name for name, ok in (
        ("job_id", group.job_id == attempt.job_id), ("attempt", group.attempt == attempt.attempt),
        ("spec", group.spec == attempt.spec), ("storage_url", group.storage_url == attempt.storage_url),
        ("allowed_prefixes", group.allowed_prefixes == attempt.allowed_prefixes),
        ("resume_key", group.resume_key is None or group.resume_key.startswith(own)),
        ("resume_entry", group.resume_entry is None or all(key.startswith(own) for key in group.resume_entry.object_keys())),
    ) if not ok]
    if wrong:
        raise OrderRefused(f"the ranks' order is not this attempt's ({', '.join(wrong)} differ): it is not published")
    return group


class LedDelivery(Protocol):
    """A delivery a gang is led for (``baton.workers.queue.delivery.Delivery``)."""

    job_id: str
    attempt: int
    nodes: int
    queue: str

    def pass_on(self, why: str, event: Optional[str] = None) -> str:
        """Hand the message back unclaimed, the record saying ``event``."""

    def run(self, leadership: Optional["Leadership"] = None) -> str:
        """Claim the attempt and train it."""


class Leadership:
    """What a gang's leader gives its attempt: where to serve the rendezvous, how to publish it, and
    what the other nodes reported."""

    def __init__(self, gangs: Gangs, led: Led, address: str):
        self.gangs, self.led, self.nodes, self.address = gangs, led, led.nodes, address
        self.loss_wait_s = REPORT_WAIT_S

    def announce(self, endpoint: str, secret: str, order: str, attempt: AttemptOrder) -> None:
        """Publish the rendezvous and the ranks' ``order`` (a GroupOrder's JSON) for the other nodes. The
        order comes from the training process, where the job's code runs: it must be ``attempt``'s
        (``matching_order``), or the other nodes would act on what the code wrote."""
        matching_order(order, attempt)
        if not self.gangs.start(self.led, endpoint, secret, order):
            raise RankLost(f"the gang of job {self.led.job_id} was dissolved before its ranks could start")

    def remote_failure(self) -> Optional[BaseException]:
        """A follower's report: the job's code failed on one of its ranks (RankFailed), a rank or the
        node was lost (RankLost: reported, or its worker's lease in the gang lapsed before its ranks
        finished), or its worker is shutting down (NodeReleased); None before, and while Redis cannot
        be read (the collective's own failure still ends the attempt)."""
        try:
            gang = self.gangs.read(self.led.job_id)
            if gang is None or gang.id != self.led.id:
                return None
            lapsed = self.gangs.lapsed_members(self.led.job_id, gang)
        except redis.RedisError:
            return None
        if gang.failure:
            report = json.loads(gang.failure)
            where = f"rank {report['rank']} of {report['world_size']}"
            return RankFailed(f"{where}: {report['exception']}", report["traceback"], origin=f"on {where}")
        if gang.released:
            return NodeReleased(gang.released)
        if gang.lost:
            return RankLost(gang.lost)
        if lapsed:
            return RankLost(f"node {lapsed[0]} ({gang.workers[lapsed[0]]}) was lost: its worker's lease in the gang "
                            "lapsed")
        return None


def lead(ctx, delivery: "LedDelivery") -> str:
    """The leader's part for ``delivery`` (``baton.workers.queue.delivery``): its gang formed and admitted,
    then its attempt claimed and trained with a ``Leadership``; or its message passed on unclaimed."""
    settings = ctx.settings
    job_id, attempt, nodes, queue = delivery.job_id, delivery.attempt, delivery.nodes, delivery.queue

    def pass_on(event: str) -> str:
        return delivery.pass_on(event, event)

    gangs, address = Gangs(ctx.redis), node_address(settings)
    status, led = gangs.form(job_id, queue, attempt, nodes, ctx.worker, node_host(), settings.lease_ttl_s)
    if status == "busy":
        return pass_on(f"waiting for nodes: the gang of {gangs.busy_with(queue) or 'another job'} is forming on "
                       f"queue {queue} first")
    if led is None:
        _log.info("job %s attempt %d: dropped (gang: %s)", job_id, attempt, status)
        return "dropped"
    for _ in range(nodes - 1):
        ctx.publish_join(job_id, attempt, nodes, queue)
    _log.info("job %s attempt %d: leading a gang of %d nodes; waiting for them to join", job_id, attempt, nodes)
    deadline = time.monotonic() + settings.gang_timeout_s
    offers = _Offers(lambda: ctx.publish_join(job_id, attempt, nodes, queue), nodes)
    while True:
        if not gangs.renew(led, settings.lease_ttl_s):
            return "dropped"
        state, joined = gangs.admit(led)
        if state == "admitted":
            break
        if state != "forming":  # the job no longer waits (cancelled)
            gangs.dissolve(led, "the job no longer waits for nodes")
            return "dropped"
        offered = offers.again(joined, quietly(lambda: gangs.read(job_id)))
        if offered:
            _log.info("job %s attempt %d: %s", job_id, attempt, offered)
        if time.monotonic() >= deadline or ctx.preemption.requested.is_set():
            why = (f"waiting for nodes: only {joined} of {nodes} joined in {settings.gang_timeout_s:.0f}s; offered again"
                   if not ctx.preemption.requested.is_set() else f"waiting for nodes: {ctx.worker} is shutting down")
            refused = quietly(lambda: gangs.read(job_id))
            if refused is not None and refused.refused:
                why += f"; {refused.refused}"
            gangs.dissolve(led, why)
            return pass_on(why)
        time.sleep(POLL_S)
    _log.info("job %s attempt %d: gang of %d nodes admitted", job_id, attempt, nodes)
    keeper = Renewer(lambda: gangs.renew(led, settings.lease_ttl_s), settings.heartbeat_s)
    keeper.start()
    outcome = "error"
    try:
        outcome = delivery.run(Leadership(gangs, led, address))
        return outcome
    finally:
        keeper.stop()
        gangs.dissolve(led, f"attempt {attempt} ended ({outcome})")


class _Offers:
    """The join messages a forming gang's leader publishes after its first N-1: one for each place
    freed (``Gang.freed``, counted by the scripts), and the missing places every ``REOFFER_S``."""

    def __init__(self, publish: Callable[[], None], nodes: int):
        self.publish, self.nodes = publish, nodes
        self.freed = 0
        self.last = time.monotonic()

    def again(self, joined: int, gang: Optional[Gang]) -> Optional[str]:
        """Offer what is due; what was offered, in words (None: nothing)."""
        freed = gang.freed if gang is not None else self.freed
        if freed > self.freed and joined < self.nodes:  # (a place freed and taken again in one script: none)
            count, why = min(freed - self.freed, self.nodes - joined), "freed"
        elif joined < self.nodes and time.monotonic() - self.last >= REOFFER_S:
            count, why = self.nodes - joined, f"still missing after {REOFFER_S:.0f}s"
        else:
            return None
        self.freed = max(self.freed, freed)
        for _ in range(count):
            self.publish()
        self.last = time.monotonic()
        return f"offered {count} place(s) of its gang again ({why})"


