"""Which queues live workers serve: every worker announces its queues on each reaper pass, with what it
offers every job (``baton.schemas.hosting``) and its run, so that a client can tell a job waiting on a
queue that no live worker serves, or none that can host it (``baton.storage.records.job_records``), and the
scheduler frees no worker for a job it cannot host; and which workers are drained (``baton drain``: the job yields, the worker takes no other)."""
from __future__ import annotations

from typing import Optional

import redis

from baton.schemas.hosting import WorkerOffer, read_offer
from baton.storage.records import keys
from baton.storage.records.connection import text

ANNOUNCE_EVERY_S = 2.5
"""A worker announces its queues this often (or every reaper period, if that is longer)."""
LAPSES_AFTER_ANNOUNCES = 3
"""An announcement lapses after this many intervals without a new one: one late announcement keeps it."""
LAPSES_AFTER_MIN_S = 5.0
"""...and never sooner than this: a worker whose passes come late on a loaded machine does not
flicker out of its queues."""

# KEYS: the set of queues. ARGV: worker, seconds it holds, its offer (JSON), its run, queue names...
# (Redis's clock: every worker and client share it.) Lapsed announcements are dropped by the reaper's
# turn (``prune``); a queue's set of workers goes with its last member.
_ANNOUNCE = """
local t = redis.call('TIME')
local lapses_at = tonumber(t[1]) + tonumber(t[2]) / 1e6 + tonumber(ARGV[2])
for i = 5, #ARGV do
  local key = '@P' .. ARGV[i] .. ':workers'
  redis.call('ZADD', key, lapses_at, ARGV[1])
  redis.call('SADD', KEYS[1], ARGV[i])
end
redis.call('HSET', '@S', ARGV[1], cjson.encode({t = tonumber(t[1]) + tonumber(t[2]) / 1e6, queues = {unpack(ARGV, 5)}}))
redis.call('HSET', '@O', ARGV[1], ARGV[3])
redis.call('HSET', '@R', ARGV[1], ARGV[4])
return 1
""".replace("@P", keys.PREFIX + ":queue:").replace("@S", keys.WORKERS_SEEN).replace(
    "@O", keys.WORKER_OFFERS).replace("@R", keys.WORKER_RUNS)


def announce_every_s(period_s: float) -> float:
    return max(period_s, ANNOUNCE_EVERY_S)


def announce(client: redis.Redis, worker: str, queues: list[str], period_s: float,
             offer: Optional[WorkerOffer] = None, run: str = "") -> None:
    """Say that ``worker`` serves ``queues`` for the next few announcement intervals, offering ``offer``
    (None: only what every worker offers), in its run ``run`` (one script)."""
    holds = max(LAPSES_AFTER_ANNOUNCES * announce_every_s(period_s), LAPSES_AFTER_MIN_S)
    client.register_script(_ANNOUNCE)(keys=[keys.QUEUES], args=[
        worker, holds, (offer or WorkerOffer()).model_dump_json(), run, *queues])


def offers(client: redis.Redis, workers: list[str]) -> dict[str, WorkerOffer]:
    """What each of ``workers`` announced it offers (one command; a worker that never said is left out)."""
    found: dict[str, WorkerOffer] = {}
    for worker, raw in zip(workers, client.hmget(keys.WORKER_OFFERS, workers) if workers else []):
        offer = read_offer(text(raw)) if raw is not None else None
        if offer is not None:
            found[worker] = offer
    return found


def runs(client: redis.Redis, workers: list[str]) -> dict[str, str]:
    """Each of ``workers``'s current run (one command; a worker that never said is left out)."""
    return {worker: text(run) for worker, run in zip(workers, client.hmget(keys.WORKER_RUNS, workers) if workers else [])
            if run is not None}


def prune(client: redis.Redis) -> None:
    """Drop the announcements that have lapsed (the reaper's turn; readers skip them meanwhile)."""
    seconds, micros = client.time()
    pipe = client.pipeline(transaction=False)
    for queue in client.smembers(keys.QUEUES):
        pipe.zremrangebyscore(keys.queue_workers(text(queue)), "-inf", seconds + micros / 1e6)
    pipe.execute()


def withdraw(client: redis.Redis, worker: str, queues: list[str]) -> None:
    """``worker`` serves its queues no more (a clean shutdown; otherwise its announcement lapses)."""
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.zrem(keys.queue_workers(queue), worker)
    pipe.execute()


def live_workers(client: redis.Redis) -> list[str]:
    """Every worker whose announcement of some queue has not lapsed."""
    seconds, micros = client.time()
    now = seconds + micros / 1e6
    found: set[str] = set()
    for queue in client.smembers(keys.QUEUES):
        found.update(map(text, client.zrangebyscore(keys.queue_workers(text(queue)), now, "+inf")))
    return sorted(found)


def seen(client: redis.Redis) -> list[dict]:
    """Every worker that announced itself within ``SEEN_KEPT_S``: ``{"name", "last_seen", "queues",
    "alive", "drained", "job"}`` (alive: its announcement has not lapsed; job: the one it holds)."""
    import json

    seconds, micros = client.time()
    now = seconds + micros / 1e6
    live = set(live_workers(client))
    busy = {text(worker): text(job) for worker, job in client.hgetall(keys.BUSY).items()}
    found: list[dict] = []
    old: list[str] = []
    for worker, raw in client.hgetall(keys.WORKERS_SEEN).items():
        name = text(worker)
        try:
            entry = json.loads(raw)
            last, queues = float(entry["t"]), [str(q) for q in entry.get("queues") or []]
        except (ValueError, KeyError, TypeError):
            continue
        if now - last > SEEN_KEPT_S:
            old.append(name)
            continue
        found.append({"name": name, "last_seen": last, "queues": queues, "alive": name in live,
                      "job": busy.get(name) if name in live else None})
    if old:
        for forgotten in (keys.WORKERS_SEEN, keys.WORKER_OFFERS, keys.WORKER_RUNS):
            client.hdel(forgotten, *old)
    marks = drained(client, [str(entry["name"]) for entry in found])
    for entry in found:
        entry["drained"] = entry["name"] in marks
    return sorted(found, key=lambda entry: (not entry["alive"], entry["name"]))


SEEN_KEPT_S = 86400.0
"""A worker not heard from for a day is forgotten (the dashboard lists the others, alive or not)."""


# KEYS: the drain mark. ARGV: the worker, the prefix of a job's key. Undrains. A gang follower's drain sets
# the mark to the id of the job it asked to yield (``gangs._RENEW_MEMBER``): that yield is withdrawn if the
# gang's leader has not read it yet, as a leader's own drain (read at each renewal) ends when undrained.
_UNDRAIN = """
local held = redis.call('GET', KEYS[1])
if not held then return 0 end
redis.call('DEL', KEYS[1])
if held ~= '1' then
  local job = ARGV[2] .. held
  local why = redis.call('HGET', job, 'yield_requested') or ''
  if redis.call('HEXISTS', job, 'yield_seen') == 0 and string.match(why, '^drained %(node %d+, (.+)%)$') == ARGV[1] then
    redis.call('HDEL', job, 'yield_requested')
  end
end
return 1
"""


def set_drained(client: redis.Redis, worker: str, drained: bool) -> bool:
    """Drain ``worker`` or undrain it; False when it already was (or was not)."""
    if drained:
        return bool(client.set(keys.worker_drained(worker), "1", nx=True))
    return bool(client.register_script(_UNDRAIN)(keys=[keys.worker_drained(worker)], args=[worker, keys.job("")]))


def drained(client: redis.Redis, workers: list[str]) -> set[str]:
    """Those of ``workers`` that are drained."""
    if not workers:
        return set()
    marks = client.mget([keys.worker_drained(worker) for worker in workers])
    return {worker for worker, mark in zip(workers, marks) if mark is not None}
