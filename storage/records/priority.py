"""Changing a job's priority after submit (``baton priority``, the dashboard): a waiting job moves to
its new place in its team's line, a running one is weighed by the scheduler at its new priority (a
higher one may then make a lower job yield, a lower one may be asked to yield), in one script with the
record, so the line never disagrees with it. The spec stored at submit keeps the priority it was
submitted with; the record's is the one the pool uses."""
from __future__ import annotations

import redis

from baton.schemas.resources import PRIORITY_LIMIT
from baton.storage.records import keys
from baton.storage.records.job_records import now
from baton.storage.records.pool import LUA

# KEYS: job. ARGV: job id, priority, now. Returns 'ok', 'missing', or the state of a finished job.
_SET_PRIORITY = LUA + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 'missing' end
if state ~= 'queued' and state ~= 'retrying' and state ~= 'running' then return state end
local q, team, priority, created = pool_fields(KEYS[1])
if tostring(priority) == ARGV[2] then return 'ok' end
local removed = redis.call('ZREM', '@P' .. q .. ':waiting:' .. team, pool_member(created, ARGV[1]))
redis.call('HSET', KEYS[1], 'priority', ARGV[2], 'updated_at', ARGV[3])
if removed == 1 then pool_wait(KEYS[1], ARGV[1]) end
local held = redis.call('HGET', '@P' .. q .. ':running', ARGV[1])
if held then
  local holder, slots = string.match(held, '^(%S+) (%d+)')
  if holder then redis.call('HSET', '@P' .. q .. ':running', ARGV[1], holder .. ' ' .. slots .. ' ' .. ARGV[2]) end
end
job_event(KEYS[1], ARGV[3], 'priority', 'priority ' .. priority .. ' -> ' .. ARGV[2], '')
return 'ok'
""".replace("@P", keys.PREFIX + ":queue:")

def set_priority(client: redis.Redis, job_id: str, priority: int) -> str:
    """'ok', 'missing' (no such record), or the state of a job that has ended (its priority is kept)."""
    if not -PRIORITY_LIMIT <= priority <= PRIORITY_LIMIT:
        raise ValueError(f"priority {priority} is outside -{PRIORITY_LIMIT}..{PRIORITY_LIMIT}")
    result = client.register_script(_SET_PRIORITY)(keys=[keys.job(job_id)], args=[job_id, str(priority), now()])
    return result.decode() if isinstance(result, bytes) else str(result)
