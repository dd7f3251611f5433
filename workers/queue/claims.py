"""An attempt's claim where Redis and the object store disagree, and its end after a Redis outage.

- **Catching up.** Attempt numbers are the fencing tokens, and Redis hands them out; the manifest
  keeps the highest one that wrote it, with the nonce of its claim. When Redis comes back behind
  the store (an append-only file that lost its last second, a promoted replica, a restore from
  backup), a claim finds the manifest ahead of it, or its very number held by another claim.
  Fencing it out would cost the job a lost worker per attempt number Redis is behind, until it
  fails. Instead, while Redis still says the job is this claim's (its lease, the record at its
  attempt), one script moves the record's attempt and the lease past the manifest's, and the
  attempt trains under that number.
- **Release if still mine.** An attempt stopped because Redis could not be reached (its lease
  could not be confirmed) gives its job back once Redis answers again, uncounted, if the job is
  still its own. Otherwise a reaper has re-queued it (uncounted too when it saw the outage,
  ``reaper.py``) or another attempt owns it.

Used by ``delivery.Held``.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable

from baton.schemas.errors import FencedOut, LeaseUnconfirmed, ManifestAhead
from baton.storage.stores.base import ObjectStore
from baton.storage.layout import JobPaths
from baton.storage.manifest_store import ManifestStore
from baton.workers.tracking import prometheus

from baton.storage.records import leases
from baton.storage.records.job_records import CANCELLED_AS_IT_STOPPED
from baton.workers.queue.redis_retry import while_leased

if TYPE_CHECKING:
    from baton.workers.queue.worker_control import WorkerControl

_log = logging.getLogger("baton.worker")

CATCH_UP_TRIES = 3
"""Times an attempt catches up past the manifest before it gives up (each needs another claim to
have moved the manifest meanwhile)."""
REDIS_RETURN_WAIT_S = 120.0
"""How long an attempt stopped by a Redis outage waits for Redis, to give its job back uncounted;
past that a reaper re-queues it (uncounted too, if it saw the outage)."""


def catch_up_with_manifest(control: "WorkerControl", attempt: int, nonce: str, store: ObjectStore) -> int:
    """Claim the manifest as ``attempt`` (with the claim's ``nonce``); when it is ahead, move this
    claim past it while Redis still says the job is ours. Returns the attempt to train as;
    FencedOut if the job is not ours."""
    ctx, job_id = control.ctx, control.job_id
    manifests = ManifestStore(store, JobPaths(job_id))
    for _ in range(CATCH_UP_TRIES):
        try:
            manifests.update(attempt, lambda m: None, claim=nonce)
            return attempt
        except ManifestAhead as exc:
            newer = exc.current + 1
            new_token = leases.token(newer, ctx.worker, nonce)
            held = control.token
            # retried *inside* the swap: between a try whose reply was lost (it may have moved the
            # lease) and its retry, a renewal with the old token would find the lease gone and
            # fence this attempt out; the script is idempotent for this claim, so retrying is safe
            moved = control.heartbeat.swap_token(lambda: control.leased(
                lambda: leases.catch_up(ctx.redis, job_id, held, attempt, newer, new_token, ctx.settings.lease_ttl_s),
                "catching up with the manifest"), new_token)
            if not moved:
                raise FencedOut(f"job {job_id}: attempt {attempt} is behind the manifest ({exc}) and no longer "
                                f"holds the job") from None
            _log.warning("job %s: attempt %d was behind the manifest (%s): Redis was behind the store; "
                         "caught up as attempt %d", job_id, attempt, exc, newer)
            attempt = newer
    raise FencedOut(f"job {job_id}: the manifest kept moving ahead of attempt {attempt}")


def release_if_still_mine(control: "WorkerControl", attempt: int, publish: Callable[[int], None]) -> None:
    """After the attempt stopped because Redis could not be reached: once Redis answers again, give
    the job back uncounted if it is still this attempt's, and ``publish`` its next attempt."""
    ctx, job_id = control.ctx, control.job_id
    reason = f"Redis was unreachable from {ctx.worker}; released, not counted as a loss"
    wait_until = time.monotonic() + REDIS_RETURN_WAIT_S
    try:
        next_attempt = while_leased(
            lambda: ctx.records.release_if_still_mine(job_id, control.token, attempt, ctx.worker, reason),
            lambda: wait_until, f"job {job_id}: the release after a Redis outage")
    except LeaseUnconfirmed as exc:
        _log.warning("job %s: %s; a reaper will re-queue it", job_id, exc)
        return
    if next_attempt == CANCELLED_AS_IT_STOPPED:
        _log.info("job %s: cancelled after the Redis outage (asked for meanwhile)", job_id)
        return
    if next_attempt < 0:
        _log.info("job %s: not released after the Redis outage: a reaper or another attempt has moved it on", job_id)
        return
    prometheus.JOBS_RETRIED.labels("redis").inc()
    publish(next_attempt)
    _log.warning("job %s: released after a Redis outage (not counted as a loss), queued as attempt %d",
                 job_id, next_attempt)
