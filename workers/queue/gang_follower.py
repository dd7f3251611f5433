"""A multi-node job's follower: a worker that took a join message of its gang (``gang_leader`` holds the
leader's part; ``baton.storage.records.gangs`` forms the gang in Redis).

It joins, keeps its place (a lease of its own) while it waits, and once the rendezvous is published
starts its node's ranks with their global numbers (``baton.workers.parallel.nodes.start_node``). A
sharded checkpoint to resume from is downloaded to this node's scratch first, every file verified. It
then watches its ranks, the gang and its own lease:

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
import time
from typing import TYPE_CHECKING, Optional

import redis

from baton.schemas.messages import GroupOrder
from baton.storage import owned_dirs
from baton.storage.artifacts import download_checkpoint
from baton.storage.records.gangs import Gang, Gangs, Membership
from baton.workers.queue.store_gate import StoreGate
from baton.storage.stores.open import open_store
from baton.workers.parallel import failure_report
from baton.workers.parallel.job_identity import readable_inside
from baton.workers.queue.gang_node import POLL_S, Renewer, node_host, quietly

if TYPE_CHECKING:
    from baton.workers.parallel.launcher import Ranks
# the node's ranks (launcher, nodes) need torch.distributed: imported by a follower before it joins a gang
# (``follow``), so that a worker's main process, which has no torch, pays for it only when it follows one

_log = logging.getLogger("baton.worker")

WATCH_S = 0.2
"""How often a follower looks at its ranks (and, every few looks, at its gang)."""
def follow(ctx, job_id: str, attempt: int, nodes: int, queue: str, cannot_host: Optional[str] = None,
           pass_on_wait_s: float = 0.0) -> str:
    """A follower's part, for the join message of ``attempt`` (on ``queue``). A worker that ``cannot_host``
    a node (why not: GPUs, code, store) hands the join message back, after ``pass_on_wait_s``, for another."""
    settings = ctx.settings
    if cannot_host is not None:
        _log.warning("job %s attempt %d: not joining its gang: %s", job_id, attempt, cannot_host)
        time.sleep(pass_on_wait_s)
        ctx.publish_join(job_id, attempt, nodes, queue)
        return "passed on"
    # the ranks' modules import torch.distributed (seconds of a core, holding the GIL): before joining, while
    # no membership lease is held that a stalled renewer thread could let lapse
    import baton.workers.parallel.nodes  # noqa: F401

    gangs = Gangs(ctx.redis)
    membership, why = gangs.join(job_id, attempt, nodes, ctx.worker, node_host(), settings.gang_distinct,
                                 settings.lease_ttl_s)
    if membership is None:
        _log.info("job %s attempt %d: not joined (%s)", job_id, attempt, why)
        return "dropped"
    _log.info("job %s attempt %d: joined its gang as node %d", job_id, attempt, membership.node)
    keeper = Renewer(lambda: gangs.renew_member(job_id, membership, settings.lease_ttl_s), settings.heartbeat_s)
    keeper.start()
    # a shutdown from here on (its grace over, or a second signal) tells the leader: not counted as a loss
    ctx.preemption.register(job_id, lambda reason: quietly(lambda: gangs.report(
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
        quietly(lambda: gangs.leave(job_id, membership))


def _wait_for_start(ctx, gangs: Gangs, job_id: str, membership: Membership, keeper: Renewer) -> Optional[Gang]:
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


def _run_node(ctx, gangs: Gangs, job_id: str, gang: Gang, membership: Membership, keeper: Renewer) -> str:
    if gang.args is None or gang.endpoint is None or gang.secret is None:  # (a running gang has all three)
        return _report(gangs, job_id, gang, "lost", f"node {membership.node} ({ctx.worker}): the gang started "
                       "without its rendezvous")
    # what this worker allows its ranks to import, whatever the leader's worker allows
    order = GroupOrder.model_validate_json(gang.args).model_copy(
        update={"allowed_prefixes": ctx.settings.allowed_prefixes})
    store = open_store(order.storage_url)
    # (a file store's scratch directory is inside the store, which a job of its own user may not enter)
    scratch = owned_dirs.make(owned_dirs.SPOOL_PREFIX, None if ctx.users.user else store.scratch_dir())
    try:
        if order.resume_entry is not None:  # sharded: this node's copy of the checkpoint the leader chose, verified
            try:
                resume_dir = download_checkpoint(store, order.resume_entry, scratch / "resume")
                readable_inside(scratch)  # (its ranks may run as the job's own user: ``scratch`` is lent to them)
            except Exception as exc:  # noqa: BLE001 - unreachable, corrupt, a full disk: this node's loss
                return _report(gangs, job_id, gang, "lost", f"node {membership.node} ({ctx.worker}) could not read "
                               f"the checkpoint: {type(exc).__name__}: {exc}")
            order = order.model_copy(update={"resume_dir": str(resume_dir)})
        try:  # this worker's own copy of the job's shipped code, checked against its digest
            import_path, said = ctx.code.import_path(store, order.spec.code)
        except Exception as exc:  # noqa: BLE001 - changed in the store, unreachable: this node's loss
            return _report(gangs, job_id, gang, "lost", f"node {membership.node} ({ctx.worker}) could not have the "
                           f"job's code: {type(exc).__name__}: {exc}")
        for line in said:
            _log.info("job %s: %s", job_id, line)
        order = order.model_copy(update={"import_path": import_path})
        if ctx.preemption.requested.is_set():  # shutting down before its ranks started
            return _report(gangs, job_id, gang, "released", f"node {membership.node} ({ctx.worker}) is shutting down")
        from baton.workers.attempt.process import context
        from baton.workers.parallel.nodes import start_node

        # the ranks' store: this job's objects only; their user: the job's own on this node (``job_users``)
        with StoreGate(store, job_id, ctx.redact) as gate, \
                ctx.users.lent(gate, (*import_path, str(scratch))) as tenancy:
            ranks = start_node(order.model_copy(update={"identity": tenancy.identity}), membership.node, gang.endpoint,
                               gang.secret, lambda message: _log.info("job %s: %s", job_id, message), context(), gate.url)
            try:
                return _watch(ctx, gangs, job_id, gang, membership, keeper, ranks)
            finally:
                ranks.kill()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _watch(ctx, gangs: Gangs, job_id: str, gang: Gang, membership: Membership, keeper: Renewer,
           ranks: Ranks) -> str:
    from baton.workers.parallel import launcher

    forwarded = False
    looks = 0
    unread_since: Optional[float] = None  # Redis unreachable since (a blip is no reason to stop)
    while True:
        codes = [proc.poll() for proc in ranks.procs]
        if all(code == 0 for code in codes):
            quietly(lambda: gangs.mark_done(job_id, gang.id, membership.node))  # its lease may go now: not a loss
            return "done"
        if any(code not in (None, 0) for code in codes):
            time.sleep(launcher.SETTLE_S)  # a rank whose collective broke under it may exit before the one that failed
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
    from baton.workers.parallel import launcher

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
    return _report(gangs, job_id, gang, "lost", f"{launcher.describe_exit(rank, code)} on {where}")


def _report(gangs: Gangs, job_id: str, gang: Gang, what: str, detail: str) -> str:
    _log.warning("job %s: %s: %s", job_id, what, detail)
    quietly(lambda: gangs.report(job_id, gang.id, what, detail))
    return what


