"""A multi-node job's attempt on each of its workers: the leader's part and a follower's (``gang.py``
forms the gang in Redis).

**The leader** (the worker that took the message of the job's next attempt) forms the gang,
publishes N-1 join messages to the job's queue and waits until the gang is admitted, renewing it
meanwhile. Only then does it claim the attempt and run it as any job, with a ``Leadership``: its rank
0 serves the rendezvous (a TCP store on a free port of ``node_address``) and publishes it, with the
attempt's secret and the ranks' arguments, in the gang's record. A gang that does not fill within
``gang_timeout_s`` is dissolved and its message passed on: no attempt is claimed. However the
attempt ends, the leader dissolves its gang, and every follower's ranks are killed.

**A follower** (a worker that took a join message) joins, keeps its place (a lease of its own) while
it waits, and once the rendezvous is published starts its node's ranks with their global numbers
(``Ranks``). A sharded checkpoint to resume from is downloaded to this node's scratch first, every
file verified. It then watches its ranks, the gang and its own lease:

- a rank that fails in the job's code: its report goes to the leader through the gang's record (the
  leader fails the job with that traceback); a rank that dies otherwise: a loss, likewise reported;
- the gang dissolved (the attempt ended, or the leader's node was lost: its ranks die with it, the
  others' collectives fail) or this worker's place lost: its ranks are killed;
- SIGTERM to this worker: passed to its ranks, which stop with every other rank at the same step
  after one checkpoint (the stop flag is agreed across the whole group at every step).
"""
from __future__ import annotations

import json
import logging
import shutil
import signal
import socket
import threading
import time
from typing import Callable, Optional, TypeVar

import redis

from baton.schemas.messages import GroupOrder
from baton.storage import owned_dirs
from baton.storage.artifacts import download_checkpoint
from baton.storage.checkpointing.checkpointer import SPOOL_PREFIX
from baton.storage.stores.open import open_store
from baton.workers.parallel import failure_report
from baton.workers.parallel.errors import NodeReleased, RankFailed, RankLost
from baton.workers.parallel.launcher import SETTLE_S, Ranks, describe_exit
from baton.workers.parallel.nodes import start_node

from baton.storage.records import keys

from baton.storage.records.gangs import Gang, Gangs, Led, Membership

_log = logging.getLogger("baton.worker")
T = TypeVar("T")

POLL_S = 0.1
"""How often a leader looks for its gang to fill, and a follower for its gang to start."""
REOFFER_S = 30.0
"""While a forming gang misses places and no place was offered for this long, the leader offers the
missing places again: a join message taken by a worker that was then SIGKILLed is gone unseen."""
WATCH_S = 0.2
"""How often a follower looks at its ranks (and, every few looks, at its gang)."""
REPORT_WAIT_S = 3.0
"""How long the leader's rank 0, its collective broken, waits for another node's report of why (a
follower reports within WATCH_S + SETTLE_S of its rank's end) before it counts the attempt lost.
Waiting for a dead follower's lease to lapse instead would add up to a lease TTL to every recovery."""


def node_address(settings) -> str:
    """Where this worker is reached by other nodes: BATON_NODE_ADDRESS, else the address of the
    interface its default route leaves by (a host name often resolves to loopback: 127.0.1.1 on
    Debian), else its host name."""
    if settings.node_address:
        return settings.node_address
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # a UDP "connect" sends nothing: it only chooses the route
            address = probe.getsockname()[0]
        if not address.startswith("127."):
            return address
    except OSError:
        pass
    return socket.gethostname()


def node_host() -> str:
    """What tells this worker's host from another's (gangs' nodes are distinct hosts): its host name,
    the pod's name on Kubernetes."""
    return socket.gethostname()


class Leadership:
    """What a gang's leader gives its attempt: where to serve the rendezvous, how to publish it, and
    what the other nodes reported."""

    def __init__(self, gangs: Gangs, led: Led, address: str):
        self.gangs, self.led, self.nodes, self.address = gangs, led, led.nodes, address
        self.loss_wait_s = REPORT_WAIT_S

    def announce(self, endpoint: str, secret: str, order: str) -> None:
        """Publish the rendezvous and the ranks' ``order`` (a GroupOrder's JSON) for the other nodes."""
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


def lead(ctx, job_id: str, attempt: int, nodes: int, queue: str, pass_on: Callable[[str], str],
         run: Callable[[Leadership], str]) -> str:
    """The leader's part; ``pass_on(event)`` hands the message back unclaimed, ``run`` claims the
    attempt and trains it (``job_runner``)."""
    settings = ctx.settings
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
        offered = offers.again(joined, _quietly(lambda: gangs.read(job_id)))
        if offered:
            _log.info("job %s attempt %d: %s", job_id, attempt, offered)
        if time.monotonic() >= deadline or ctx.preemption.requested.is_set():
            why = (f"waiting for nodes: only {joined} of {nodes} joined in {settings.gang_timeout_s:.0f}s; offered again"
                   if not ctx.preemption.requested.is_set() else f"waiting for nodes: {ctx.worker} is shutting down")
            refused = _quietly(lambda: gangs.read(job_id))
            if refused is not None and refused.refused:
                why += f"; {refused.refused}"
            gangs.dissolve(led, why)
            return pass_on(why)
        time.sleep(POLL_S)
    _log.info("job %s attempt %d: gang of %d nodes admitted", job_id, attempt, nodes)
    keeper = _Renewer(lambda: gangs.renew(led, settings.lease_ttl_s), settings.heartbeat_s)
    keeper.start()
    outcome = "error"
    try:
        outcome = run(Leadership(gangs, led, address))
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


def gang_size(client: redis.Redis, job_id: str) -> tuple[Optional[int], str]:
    """(resources.nodes, queue) from the job's record; (None, ...) when Redis cannot be read; (1, ...)
    when the record holds no spec that says (the claim decides: a missing job is dropped there)."""
    try:
        raw, queue = client.hmget(keys.job(job_id), ["spec", "queue"])
    except redis.RedisError:
        return None, "default"
    try:
        return int(json.loads(raw)["resources"].get("nodes", 1)), queue or "default"
    except (ValueError, KeyError, TypeError, AttributeError):
        return 1, queue or "default"


def follow(ctx, job_id: str, attempt: int, nodes: int, cannot_host: Optional[str] = None,
           pass_on_wait_s: float = 0.0) -> str:
    """A follower's part, for the join message of ``attempt``. A worker that ``cannot_host`` a node
    (why not: GPUs, code, store) hands the join message back, after ``pass_on_wait_s``, for another."""
    settings = ctx.settings
    if cannot_host is not None:
        _log.warning("job %s attempt %d: not joining its gang: %s", job_id, attempt, cannot_host)
        time.sleep(pass_on_wait_s)
        ctx.publish_join(job_id, attempt, nodes, gang_size(ctx.redis, job_id)[1])
        return "passed on"
    gangs = Gangs(ctx.redis)
    membership, why = gangs.join(job_id, attempt, nodes, ctx.worker, node_host(), settings.gang_distinct,
                                 settings.lease_ttl_s)
    if membership is None:
        _log.info("job %s attempt %d: not joined (%s)", job_id, attempt, why)
        return "dropped"
    _log.info("job %s attempt %d: joined its gang as node %d", job_id, attempt, membership.node)
    keeper = _Renewer(lambda: gangs.renew_member(job_id, membership, settings.lease_ttl_s), settings.heartbeat_s)
    keeper.start()
    # a shutdown from here on (its grace over, or a second signal) tells the leader: not counted as a loss
    ctx.preemption.register(job_id, lambda reason: _quietly(lambda: gangs.report(
        job_id, membership.gang, "released", f"node {membership.node} ({ctx.worker}): {reason}")))
    try:
        gang = _wait_for_start(ctx, gangs, job_id, membership, keeper)
        if gang is None:
            _log.info("job %s attempt %d: the gang did not start; left it", job_id, attempt)
            return "left"
        return _run_node(ctx, gangs, job_id, gang, membership, keeper)
    finally:
        ctx.preemption.unregister(job_id)
        keeper.stop()
        _quietly(lambda: gangs.leave(job_id, membership))


def _wait_for_start(ctx, gangs: Gangs, job_id: str, membership: Membership, keeper: "_Renewer") -> Optional[Gang]:
    """The gang once its leader published the rendezvous; None when it was dissolved or expired (its
    leader renews it while it lives: no deadline here), this place was lost, or this worker is shutting
    down (a gang already admitted is told so: the leader releases the job, uncounted)."""
    unread_since: Optional[float] = None
    while not keeper.lost.is_set():
        try:
            gang = gangs.read(job_id)
            unread_since = None
        except redis.RedisError:
            unread_since = unread_since or time.monotonic()
            if time.monotonic() - unread_since >= ctx.settings.lease_ttl_s:
                return None
            time.sleep(POLL_S)
            continue
        if gang is None or gang.id != membership.gang or gang.state == "dissolved":
            return None
        if ctx.preemption.requested.is_set():
            if gang.state != "forming":
                _report(gangs, job_id, gang, "released", f"node {membership.node} ({ctx.worker}) is shutting down")
            return None
        if gang.state == "running":
            return gang
        time.sleep(POLL_S)
    return None


def _run_node(ctx, gangs: Gangs, job_id: str, gang: Gang, membership: Membership, keeper: "_Renewer") -> str:
    # what this worker allows its ranks to import, whatever the leader's worker allows
    order = GroupOrder.model_validate_json(gang.args).model_copy(
        update={"allowed_prefixes": ctx.settings.allowed_prefixes})
    store = open_store(order.storage_url)
    scratch = owned_dirs.make(SPOOL_PREFIX, store.scratch_dir())
    try:
        if order.resume_entry is not None:  # sharded: this node's copy of the checkpoint the leader chose, verified
            try:
                resume_dir = download_checkpoint(store, order.resume_entry, scratch / "resume")
            except Exception as exc:  # noqa: BLE001 - unreachable, corrupt, a full disk: this node's loss
                return _report(gangs, job_id, gang, "lost", f"node {membership.node} ({ctx.worker}) could not read "
                               f"the checkpoint: {type(exc).__name__}: {exc}")
            order = order.model_copy(update={"resume_dir": str(resume_dir)})
        if ctx.preemption.requested.is_set():  # shutting down before its ranks started
            return _report(gangs, job_id, gang, "released", f"node {membership.node} ({ctx.worker}) is shutting down")
        ranks = start_node(order, membership.node, gang.endpoint, gang.secret,
                           lambda message: _log.info("job %s: %s", job_id, message))
        try:
            return _watch(ctx, gangs, job_id, gang, membership, keeper, ranks)
        finally:
            ranks.kill()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _watch(ctx, gangs: Gangs, job_id: str, gang: Gang, membership: Membership, keeper: "_Renewer",
           ranks: Ranks) -> str:
    forwarded = False
    looks = 0
    unread_since: Optional[float] = None  # Redis unreachable since (a blip is no reason to stop)
    while True:
        codes = [proc.poll() for proc in ranks.procs]
        if all(code == 0 for code in codes):
            _quietly(lambda: gangs.mark_done(job_id, gang.id, membership.node))  # its lease may go now: not a loss
            return "done"
        if any(code not in (None, 0) for code in codes):
            time.sleep(SETTLE_S)  # a rank whose collective broke under it may exit before the one that failed
            return _report_end(ctx, gangs, job_id, gang, membership, ranks)
        if ctx.preemption.requested.is_set() and not forwarded:  # every rank stops at the same step, once
            for proc in ranks.procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            forwarded = True
        looks += 1
        if looks % 5 == 0:
            try:
                now = gangs.read(job_id)
                unread_since = None
            except redis.RedisError as exc:
                unread_since = unread_since or time.monotonic()
                if time.monotonic() - unread_since < ctx.settings.lease_ttl_s:
                    time.sleep(WATCH_S)
                    continue
                _log.warning("job %s: Redis unreachable for %.0fs (%s); stopping node %d's ranks", job_id,
                             ctx.settings.lease_ttl_s, exc, membership.node)
                return "lost"
            if now is None or now.id != gang.id or now.state != "running":
                _log.warning("job %s: its gang ended (%s); stopping node %d's ranks", job_id,
                             now.reason if now is not None else "gone", membership.node)
                return "dissolved"
            if keeper.lost.is_set():
                _log.warning("job %s: node %d lost its place in the gang; stopping its ranks", job_id, membership.node)
                return "lost"
        time.sleep(WATCH_S)


def _report_end(ctx, gangs: Gangs, job_id: str, gang: Gang, membership: Membership, ranks: Ranks) -> str:
    """Tell the leader why this node's ranks ended, judged as the leader judges its own: a rank killed
    by a signal is a loss before any report (a rank whose collective broke may report after it); else
    the job's code failed where a rank reported it; ranks ended by this worker's own shutdown are a
    release (not counted); anything else is a loss."""
    codes = [proc.poll() for proc in ranks.procs]
    ended = sorted(((rank, code) for rank, code in zip(ranks.ranks, codes) if code not in (None, 0)),
                   key=lambda ended_rank: ended_rank[1] >= 0)  # killed by a signal first
    rank, code = ended[0]
    where = f"node {membership.node} ({ctx.worker})"
    if ctx.preemption.requested.is_set():
        return _report(gangs, job_id, gang, "released", f"{where} is shutting down")
    report = failure_report.read_earliest(ranks.directory)
    if code >= 0 and report is not None:
        _report(gangs, job_id, gang, "failure", json.dumps({
            "rank": report.rank, "world_size": ranks.world_size, "exception": report.exception,
            "traceback": report.traceback}))
        return "failed"
    return _report(gangs, job_id, gang, "lost", f"{describe_exit(rank, code)} on {where}")


def _report(gangs: Gangs, job_id: str, gang: Gang, what: str, detail: str) -> str:
    _log.warning("job %s: %s: %s", job_id, what, detail)
    _quietly(lambda: gangs.report(job_id, gang.id, what, detail))
    return what


def _quietly(call: Callable[[], T]) -> Optional[T]:
    """A call on the gang's record that may fail: the leader still learns what happened (its collective
    breaks, or this node's lease lapses), a status goes without a detail."""
    try:
        return call()
    except redis.RedisError as exc:
        _log.warning("could not reach the gang's record (%s)", exc)
        return None


class _Renewer(threading.Thread):
    """Calls ``renew`` every ``every_s`` until stopped; ``lost`` once a renewal says the place is gone."""

    def __init__(self, renew: Callable[[], bool], every_s: float):
        super().__init__(name="baton-gang-renewal", daemon=True)
        self._renew, self._every_s = renew, every_s
        self._stopping = threading.Event()
        self.lost = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(self._every_s):
            try:
                if not self._renew():
                    self.lost.set()
                    return
            except Exception as exc:  # noqa: BLE001 - Redis away: try again next period
                _log.warning("gang renewal failed (%s); trying again", exc)

    def stop(self) -> None:
        self._stopping.set()
