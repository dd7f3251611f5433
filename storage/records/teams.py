"""Each team's limits (``baton teams set T --max-priority N``): a hash of team -> the highest priority
its jobs may have. A team with no entry has no limit of its own."""
from __future__ import annotations

from typing import Optional

import redis

from baton.schemas.resources import PRIORITY_LIMIT
from baton.storage.records import keys
from baton.storage.records.connection import maybe_text, texts


def set_max_priority(r: redis.Redis, team: str, limit: Optional[int]) -> None:
    """``limit`` for ``team`` (None: its limit removed)."""
    if limit is None:
        r.hdel(keys.TEAM_MAX_PRIORITY, team)
        return
    if not -PRIORITY_LIMIT <= limit <= PRIORITY_LIMIT:
        raise ValueError(f"a max priority lies within +-{PRIORITY_LIMIT:,}, not {limit:,}")
    r.hset(keys.TEAM_MAX_PRIORITY, team, str(limit))


def max_priority(r: redis.Redis, team: str) -> Optional[int]:
    value = maybe_text(r.hget(keys.TEAM_MAX_PRIORITY, team))
    return None if value is None else int(value)


def limits(r: redis.Redis) -> dict[str, int]:
    return {team: int(value) for team, value in sorted(texts(r.hgetall(keys.TEAM_MAX_PRIORITY)).items())}
