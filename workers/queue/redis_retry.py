"""Redis calls a worker makes under its lease: a Redis restart or failover is waited out.

A dropped connection, a restarted Redis still loading its data, or a demoted primary refusing
writes is infrastructure, not the job's failure. Such a call is retried with backoff for as long
as the lease may still be valid (its last confirmed renewal plus the TTL); past that nothing
proves the job is still this attempt's, so the attempt stops as if fenced out, committing
nothing (``LeaseUnconfirmed``), and the job goes back to the queue through its lease.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

import redis

from baton.schemas.errors import LeaseUnconfirmed

_log = logging.getLogger("baton.worker")
T = TypeVar("T")

TRANSIENT_REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ReadOnlyError) + tuple(
    getattr(redis.exceptions, name) for name in ("MasterDownError", "TryAgainError") if hasattr(redis.exceptions, name))
"""Errors that pass when Redis comes back (ConnectionError includes BusyLoadingError: a restarted
Redis loading its append-only file; READONLY, MASTERDOWN and TRYAGAIN come during a failover, from
a replica that is not, or not yet, the primary). Anything else from Redis is a bug and is raised."""
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 1.0


def while_leased(call: Callable[[], T], valid_until: Callable[[], float], what: str) -> T:
    """``call()``, retried through transient Redis errors until ``valid_until()`` (time.monotonic)."""
    delay, warned = BACKOFF_FIRST_S, False
    while True:
        try:
            result = call()
        except TRANSIENT_REDIS_ERRORS as exc:
            left = valid_until() - time.monotonic()
            if left <= 0:
                raise LeaseUnconfirmed(f"{what}: Redis unreachable until the lease may have expired "
                                       f"({type(exc).__name__}: {exc})") from exc
            if not warned:
                _log.warning("Redis unavailable for %s (%s: %s): retrying while the lease may be valid (%.1fs)",
                             what, type(exc).__name__, exc, left)
                warned = True
            time.sleep(min(delay, left))
            delay = min(2 * delay, BACKOFF_MAX_S)
            continue
        if warned:
            _log.warning("Redis back for %s", what)
        return result
