"""The audit trail's recent part in Redis: a list, newest first, bounded (``KEEP``), so that the pool's
Redis never grows with its history; the server also appends every entry to the store, which keeps it
all. ``recent`` reads it back filtered by time and principal (``baton audit --since 1h --user U``)."""
from __future__ import annotations

from typing import Optional

import redis

from baton.schemas.audit import AuditEntry
from baton.storage.records import keys
from baton.storage.records.connection import text

KEEP = 100_000
"""Entries kept in Redis (about 200 bytes each: ~20 MB)."""


def append(r: redis.Redis, entry: AuditEntry, keep: int = KEEP) -> None:
    with r.pipeline(transaction=True) as pipe:
        pipe.lpush(keys.AUDIT, entry.model_dump_json())
        pipe.ltrim(keys.AUDIT, 0, keep - 1)
        pipe.execute()


def recent(r: redis.Redis, since: Optional[float] = None, principal: Optional[str] = None,
           limit: int = 1000, batch: int = 500) -> list[AuditEntry]:
    """Entries at or after ``since`` (unix time), of ``principal`` if given, newest first, at most ``limit``.
    Read in batches from the newest, stopping at the first entry older than ``since``."""
    found: list[AuditEntry] = []
    start = 0
    while len(found) < limit:
        raw = r.lrange(keys.AUDIT, start, start + batch - 1)
        if not raw:
            break
        for item in raw:
            entry = AuditEntry.model_validate_json(text(item))
            if since is not None and entry.at < since:
                return found
            if principal is None or entry.principal == principal:
                found.append(entry)
                if len(found) == limit:
                    return found
        start += batch
    return found
