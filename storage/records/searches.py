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


_END = """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'best', ARGV[3], 'error', ARGV[4], 'finished_at', ARGV[5])
redis.call('SREM', KEYS[2], ARGV[1])
return 1
"""


def _end(client: redis.Redis, search_id: str, state: str, best: Optional[str], error: Optional[str]) -> bool:
    """A running search ends (one script: an end never overwrites another); False if it was not running."""
    return bool(client.eval(_END, 2, keys.search(search_id), keys.SEARCHES, search_id, state, best or "", error or "",
                            now()))


def finish(client: redis.Redis, search_id: str, best: Optional[str], error: Optional[str] = None) -> None:
    """The search has ended: finished with its best trial, or failed (``error`` says why)."""
    _end(client, search_id, "failed" if error else "finished", best, error)


def stop(client: redis.Redis, search_id: str) -> bool:
    """Mark a running search cancelled (no decider takes another step of it); False if it was not running."""
    return _end(client, search_id, "cancelled", None, None)


def is_running(client: redis.Redis, search_id: str) -> bool:
    return maybe_text(client.hget(keys.search(search_id), "state")) == "running"


def promote_to_end(client: redis.Redis, search_id: str, trial: int) -> None:
    """Say the search itself sent this trial to the run's end (an asynchronous search's best is one of these:
    a trial resumed to its end by hand is not)."""
    client.sadd(keys.search_part(search_id, "finalists"), str(trial))


def finalists(client: redis.Redis, search_id: str) -> set[int]:
    return {int(text(n)) for n in client.smembers(keys.search_part(search_id, "finalists"))}


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
