"""A search's record in Redis: what it searches and how (``meta``), each rung's decision (written once:
a decision is never made twice, whoever advances the search), the trials' metric at each rung, and the
lock and poke counter through which exactly one process at a time decides the next step.

Its trials are ordinary jobs, indexed as a sweep (``keys.sweep``) by trial number."""
from __future__ import annotations

import json
import secrets
from typing import Optional

import redis

from baton.storage.records import keys
from baton.storage.records.connection import maybe_text, text, texts
from baton.storage.records.job_records import now

LOCK_TTL_MS = 15_000
"""How long a decider's lock lives unless renewed (it renews it with every trial it creates or reads): a
decider that died holds its search up for this long, then the next poke or reaper pass goes on."""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def create(client: redis.Redis, search_id: str, fields: dict[str, str]) -> bool:
    """The search's record (state running); False if the id is taken."""
    if not client.hsetnx(keys.search(search_id), "created_at", now()):
        return False
    record: dict = {**fields, "state": "running"}
    client.hset(keys.search(search_id), mapping=record)
    client.sadd(keys.SEARCHES, search_id)
    return True


def exists(client: redis.Redis, search_id: str) -> bool:
    return bool(client.exists(keys.search(search_id)))


def meta(client: redis.Redis, search_id: str) -> dict[str, str]:
    """The search's record ({} for none)."""
    return texts(client.hgetall(keys.search(search_id)))


def running(client: redis.Redis) -> list[str]:
    return sorted(map(text, client.smembers(keys.SEARCHES)))


def finish(client: redis.Redis, search_id: str, best: Optional[str], error: Optional[str] = None) -> None:
    """The search has ended: finished with its best trial, or failed (``error`` says why)."""
    ended: dict = {"state": "failed", "error": error} if error else {"state": "finished"}
    client.hset(keys.search(search_id), mapping={**ended, "best": best or "", "finished_at": now()})
    client.srem(keys.SEARCHES, search_id)


def stop(client: redis.Redis, search_id: str) -> bool:
    """Mark a running search cancelled (no decider takes another step of it); False if it was not running."""
    if maybe_text(client.hget(keys.search(search_id), "state")) != "running":
        return False
    client.hset(keys.search(search_id), mapping={"state": "cancelled", "finished_at": now()})
    client.srem(keys.SEARCHES, search_id)
    return True


def wait_for_lock(client: redis.Redis, search_id: str, poll_s: float = 0.1) -> Optional[str]:
    """The lock, once whoever holds it lets go (or it lapses: at most ``LOCK_TTL_MS``); None if it never came."""
    import time

    deadline = time.monotonic() + LOCK_TTL_MS / 1000 + 5
    while time.monotonic() < deadline:
        token = lock(client, search_id)
        if token is not None:
            return token
        time.sleep(poll_s)
    return None


def decision(client: redis.Redis, search_id: str, rung: int) -> Optional[dict]:
    raw = maybe_text(client.hget(keys.search_part(search_id, "rungs"), str(rung)))
    return json.loads(raw) if raw else None


def decide(client: redis.Redis, search_id: str, rung: int, made: dict) -> dict:
    """Record ``made`` as rung ``rung``'s decision unless one is recorded already; the recorded one."""
    client.hsetnx(keys.search_part(search_id, "rungs"), str(rung), json.dumps(made, sort_keys=True))
    found = decision(client, search_id, rung)
    assert found is not None
    return found


def value(client: redis.Redis, search_id: str, trial: int, rung: int) -> Optional[str]:
    """A trial's metric at a rung as cached ('nan' for none), or None when not read yet."""
    return maybe_text(client.hget(keys.search_part(search_id, "values"), f"{trial}:{rung}"))


def keep_value(client: redis.Redis, search_id: str, trial: int, rung: int, metric: Optional[float]) -> None:
    client.hset(keys.search_part(search_id, "values"), f"{trial}:{rung}", "nan" if metric is None else repr(metric))


def poke(client: redis.Redis, search_id: str) -> int:
    """Say a trial changed (its decider reads the search again): the new count."""
    return int(client.incr(keys.search_part(search_id, "pokes")))


def pokes(client: redis.Redis, search_id: str) -> int:
    return int(client.get(keys.search_part(search_id, "pokes")) or 0)


def lock(client: redis.Redis, search_id: str) -> Optional[str]:
    """A token when this caller now decides the search's next step, None when another does."""
    token = secrets.token_hex(8)
    return token if client.set(keys.search_part(search_id, "lock"), token, nx=True, px=LOCK_TTL_MS) else None


class LockLost(Exception):
    """A decider's lock lapsed (its step ran past ``LOCK_TTL_MS`` without renewing it)."""


def relock(client: redis.Redis, search_id: str, token: str) -> bool:
    """Renew the lock this token holds; False when it has lapsed."""
    return bool(client.eval(_RENEW, 1, keys.search_part(search_id, "lock"), token, LOCK_TTL_MS))


def unlock(client: redis.Redis, search_id: str, token: str) -> None:
    client.eval(_RELEASE, 1, keys.search_part(search_id, "lock"), token)
