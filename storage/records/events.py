"""A job's history in Redis, for people: its events (submitted, claimed, lost, yielded, resumed,
finished), written by the same scripts that change its state, and the live points of its training
curve (step, loss, learning rate) that each lease renewal carries between checkpoints.

Both are capped lists beside the job's record (``keys.job_events``, ``keys.job_live``). The events are
what the dashboard's timeline draws; the live points fill its curves until the next checkpoint's
metrics rows (the store's, which stay the record) reach past them.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Optional

import redis

from baton.storage.records import keys

EVENTS_KEPT = 500
"""A job keeps its newest events: a job preempted every minute for a week still shows its last ones."""
LIVE_POINTS_KEPT = 4000
"""Live points kept per job: the steps since the latest checkpoint's rows, at a heartbeat's pace."""

EVENT_LUA = """
local function job_event(job, now, kind, text, stamp)
  local f = redis.call('HMGET', job, 'attempt', 'step', 'worker')
  local entry = {t = tonumber(now) or 0, kind = kind, attempt = tonumber(f[1] or '0') or 0, worker = '', text = text or ''}
  stamp = stamp or 'worker step'
  if string.find(stamp, 'worker') then entry.worker = f[3] or '' end
  if string.find(stamp, 'step') then entry.step = tonumber(f[2] or '') end
  if kind == 'lost' or kind == 'lapsed' then  -- the worker's last report of this attempt, or else its claim
    local claimed = tonumber(redis.call('HGET', job, 'claimed_at') or '')
    local last = redis.call('LINDEX', job .. ':live', -1)
    local heard = last and tonumber(string.match(last, '(%S+)$'))
    if heard and claimed and heard < claimed then heard = nil end
    entry.heard = heard or claimed
    if not heard then entry.step = nil end
  end
  redis.call('RPUSH', job .. ':events', cjson.encode(entry))
  redis.call('LTRIM', job .. ':events', -@E, -1)
end
local function live_point(job, t, step, loss, lr)
  local now = string.format('%d.%06d', tonumber(t[1]), tonumber(t[2]))
  if redis.call('RPUSH', job .. ':live', step .. ' ' .. loss .. ' ' .. (lr or 'nan') .. ' ' .. now) > @L then
    redis.call('LTRIM', job .. ':live', -@L, -1)
  end
end
""".replace("@E", str(EVENTS_KEPT)).replace("@L", str(LIVE_POINTS_KEPT))
"""``job_event(job key, now, kind, text, stamp)``: one event, stamped with the record's attempt and, as
``stamp`` says ('worker step' when nil; '' for an event of the client's: submit, priority, a cancel or
resume), its worker and the last step its worker reported; a loss also with ``heard``, when the job's
worker was last heard from (its last live point);
``live_point(job key, Redis TIME, step, loss, lr)``: a live point (its caller, the lease renewal, pushes one
when the step moved)."""


@dataclass(frozen=True)
class Event:
    t: float
    kind: str  # submitted, claimed, resumed, yielded, lost, requeued, succeeded, failed, cancelled...
    attempt: int
    step: Optional[int]
    worker: str
    text: str
    heard: Optional[float] = None  # a loss: when its worker last reported progress


def add(client: redis.Redis, job_id: str, kind: str, text: str, step: Optional[int] = None) -> None:
    """An event written from Python (a resume the training process reported), stamped with the record's
    attempt and worker. A resume also drops the live points past its step: the lost attempt's, redone."""
    attempt, worker = client.hmget(keys.job(job_id), "attempt", "worker")
    entry: dict = {"t": time.time(), "kind": kind, "attempt": int(attempt or 0),
                   "worker": worker.decode() if isinstance(worker, bytes) else (worker or ""), "text": text}
    if step is not None:
        entry["step"] = step
    pipe = client.pipeline(transaction=False)
    pipe.rpush(keys.job_events(job_id), json.dumps(entry))
    pipe.ltrim(keys.job_events(job_id), -EVENTS_KEPT, -1)
    pipe.execute()
    if step is not None:
        kept = [raw for raw in client.lrange(keys.job_live(job_id), 0, -1) if _step_of(raw) <= step]
        pipe = client.pipeline(transaction=True)
        pipe.delete(keys.job_live(job_id))
        pipe.hdel(keys.job(job_id), "live_step")  # (the renewal's last point: gone with them, if past the step)
        if kept:
            pipe.rpush(keys.job_live(job_id), *kept)
        pipe.execute()


def _step_of(raw: bytes | str) -> int:
    try:
        return int((raw.decode() if isinstance(raw, bytes) else raw).split(" ", 1)[0])
    except ValueError:
        return -1


def events(client: redis.Redis, job_id: str) -> list[Event]:
    """The job's events, oldest first; an entry that does not parse (written by hand) is skipped."""
    found = []
    for raw in client.lrange(keys.job_events(job_id), 0, -1):
        try:
            entry = json.loads(raw)
            step = entry.get("step")
            heard = entry.get("heard")
            found.append(Event(float(entry["t"]), str(entry["kind"]), int(entry.get("attempt") or 0),
                               None if step is None else int(step), str(entry.get("worker") or ""),
                               str(entry.get("text") or ""), None if heard is None else float(heard)))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return found


def live_points(client: redis.Redis, job_id: str, after_step: int = -1) -> list[dict]:
    """The live points past ``after_step``: ``{"step", "loss", "lr", "time"}``, oldest first."""
    points = []
    for raw in client.lrange(keys.job_live(job_id), 0, -1):
        try:
            step, loss, lr, at = (raw.decode() if isinstance(raw, bytes) else raw).split(" ")
            if int(step) > after_step:
                points.append({"step": int(step), "loss": _finite(loss), "lr": _finite(lr), "time": float(at)})
        except ValueError:
            continue
    return points


def _finite(value: str) -> Optional[float]:
    number = float(value)
    return number if math.isfinite(number) else None
