"""A worker's hold on a job: the claim that starts an attempt, and the heartbeat that keeps it.

The claim succeeds only for the message of the next attempt (``attempt == record.attempt + 1``)
of a job waiting for a worker, so a duplicate or stale delivery is dropped without training.
Each claim carries a random nonce, in its lease token and in the manifest's fencing token, so two
claims of one attempt number (Redis lost the first) are told apart. When the claimed attempt turns
out to be behind the manifest (Redis came back behind the object store: AOF loss, a promoted
replica, a restore from backup), the holder *catches up*: while its lease is still the job's, the
record's attempt jumps past the manifest's and the lease follows, in one script, and training goes
on under the new number (``claims.py``). Nothing is counted as lost.
The heartbeat renews the lease every ``heartbeat_s`` and brings back the job's cancel flag and
the worker's stopping flag; when the lease is gone, or cannot be renewed for a whole TTL, the
attempt is fenced out and must stop.
"""
from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

import redis

from baton.jobs import keys
from baton.jobs.records import now

from baton.workers.queue.redis_retry import TRANSIENT_REDIS_ERRORS

_log = logging.getLogger("baton.worker")

_CLAIM = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {'missing'} end
if state ~= 'queued' and state ~= 'retrying' then return {'state', state} end
local current = tonumber(redis.call('HGET', KEYS[1], 'attempt'))
if tonumber(ARGV[1]) ~= current + 1 then return {'stale', tostring(current)} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {'leased'} end
redis.call('SET', KEYS[2], ARGV[5], 'PX', ARGV[3])
redis.call('HSET', KEYS[1], 'state', 'running', 'attempt', ARGV[1], 'worker', ARGV[2], 'updated_at', ARGV[4])
redis.call('HDEL', KEYS[1], 'publish_pending', 'published_at', 'republished', 'error', 'traceback')
return {'ok', redis.call('HGET', KEYS[1], 'spec'), redis.call('HGET', KEYS[1], 'storage_url')}
"""

# KEYS: job, lease. ARGV: token, attempt, new attempt, new token, ttl ms, now. 1 when caught up.
_CATCH_UP = """
local held = redis.call('GET', KEYS[2])
if held == ARGV[4] and tonumber(redis.call('HGET', KEYS[1], 'attempt')) == tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
  return 1
end
if held ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'attempt')) ~= tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[5])
redis.call('HSET', KEYS[1], 'attempt', ARGV[3], 'updated_at', ARGV[6], 'last_event',
           'attempt ' .. ARGV[2] .. ' was behind the manifest (Redis was behind the store): caught up as attempt ' .. ARGV[3])
return 1
"""

_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {0, 0, 0} end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local cancel = redis.call('HGET', KEYS[2], 'cancel_requested') == '1' and 1 or 0
return {1, cancel, redis.call('EXISTS', KEYS[3])}
"""


@dataclass(frozen=True)
class Claim:
    ok: bool
    reason: str = ""
    spec: Optional[str] = None
    storage_url: Optional[str] = None
    nonce: str = ""
    token: str = ""


def new_nonce() -> str:
    """A claim's own random id: what tells two claims of one attempt number apart."""
    return secrets.token_hex(8)


def claim(client: redis.Redis, job_id: str, attempt: int, worker: str, ttl_s: float, nonce: str = "") -> Claim:
    nonce = nonce or new_nonce()
    held = token(attempt, worker, nonce)
    script = client.register_script(_CLAIM)
    result = script(keys=[keys.job(job_id), keys.lease(job_id)],
                    args=[attempt, worker, int(ttl_s * 1000), now(), held])
    if result[0] == "ok":
        return Claim(True, spec=result[1], storage_url=result[2], nonce=nonce, token=held)
    return Claim(False, reason=" ".join(map(str, result)))


def catch_up(client: redis.Redis, job_id: str, held: str, attempt: int, new_attempt: int, new_token: str,
             ttl_s: float) -> bool:
    """Move a running claim from ``attempt`` to ``new_attempt`` (past the manifest's), if ``held`` is
    still the job's lease and the record still at ``attempt``; False otherwise (another worker owns it)."""
    script = client.register_script(_CATCH_UP)
    return bool(script(keys=[keys.job(job_id), keys.lease(job_id)],
                       args=[held, attempt, new_attempt, new_token, int(ttl_s * 1000), now()]))


def attempt_of(lease_token: str) -> int:
    return int(lease_token.split(":", 1)[0])


def token(attempt: int, worker: str, nonce: str = "") -> str:
    """The lease's value: ``<attempt>:<worker>[:<nonce>]``."""
    return f"{attempt}:{worker}:{nonce}" if nonce else f"{attempt}:{worker}"


class Heartbeat(threading.Thread):
    """Renews the lease in the background; the loop reads its flags between steps."""

    def __init__(self, client: redis.Redis, job_id: str, lease_token: str, worker: str, ttl_s: float, every_s: float,
                 on_renew: Callable[[], None] = lambda: None):
        super().__init__(name=f"baton-heartbeat-{job_id}", daemon=True)
        self._renew = client.register_script(_RENEW)
        self._keys = [keys.lease(job_id), keys.job(job_id), keys.worker_stopping(worker)]
        self._token, self._ttl_ms, self._every_s, self._ttl_s = lease_token, int(ttl_s * 1000), every_s, ttl_s
        self._stopping = threading.Event()  # not _stop: that is Thread's own method, which a fork calls
        self.fenced = threading.Event()
        self.cancel_requested = threading.Event()
        self.worker_stopping = threading.Event()
        self.unreachable = threading.Event()  # a renewal failed, or Redis took longer than a period to answer
        self._on_renew = on_renew
        self._lock = threading.Lock()  # a renewal and a change of token never overlap
        self._confirmed_at = time.monotonic()  # the claim that set the lease was sent before this

    @property
    def token(self) -> str:
        return self._token

    def swap_token(self, change: Callable[[], bool], new_token: str) -> bool:
        """Run ``change`` (the script that moves the lease to ``new_token``) between two renewals;
        renew ``new_token`` from then on if it returned True."""
        with self._lock:
            if not change():
                return False
            self._token = new_token
            return True

    def valid_until(self) -> float:
        """time.monotonic() past which the lease may have expired: the last renewal that succeeded
        was *sent* at ``_confirmed_at``, so Redis set its expiry no earlier than that plus the TTL."""
        return self._confirmed_at + self._ttl_s

    def run(self) -> None:
        while not self._stopping.wait(self._every_s):
            sent = time.monotonic()
            try:
                with self._lock:
                    held, cancel, stopping = self._renew(keys=self._keys, args=[self._token, self._ttl_ms])
            except redis.RedisError as exc:
                if isinstance(exc, TRANSIENT_REDIS_ERRORS):
                    self.unreachable.set()
                if time.monotonic() >= self.valid_until():  # cannot prove the lease is still ours
                    _log.warning("lease %s: no renewal for %.0fs (%s): fencing this attempt out", self._token,
                                 self._ttl_s, exc)
                    self.fenced.set()
                    return
                _log.warning("lease %s: renewal failed (%s); the lease holds for %.1fs more", self._token, exc,
                             self.valid_until() - time.monotonic())
                continue
            if time.monotonic() - sent > self._every_s:  # Redis held the renewal back (paused, overloaded)
                self.unreachable.set()
            if not held:
                _log.warning("lease %s %s: fencing this one out", self._token,
                             "lapsed while Redis was unreachable" if self.unreachable.is_set()
                             else "is gone: another attempt owns the job")
                self.fenced.set()
                return
            self._confirmed_at = sent
            self._on_renew()
            if cancel:
                self.cancel_requested.set()
            if stopping:
                self.worker_stopping.set()

    def stop(self) -> None:
        self._stopping.set()
