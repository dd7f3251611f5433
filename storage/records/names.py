"""The names a pool has met: the teams jobs were submitted for and the shared stores they were submitted
to. What a command checks a name it is given against (``baton quota set`` a misspelt team), and what a
worker started without a store of its own refuses to start against (``baton worker``)."""
from __future__ import annotations

import redis

from baton.storage.records import keys
from baton.storage.records.connection import text


def note(client: redis.Redis, fields: dict[str, str]) -> None:
    """The names a new job's record ``fields`` bring: its team, and its store when it is shared (not ``file://``)."""
    pipe = client.pipeline(transaction=False)
    pipe.sadd(keys.TEAMS, fields.get("team") or "default")
    if fields.get("storage_url") and not fields["storage_url"].startswith("file://"):
        pipe.sadd(keys.STORES, fields["storage_url"])
    pipe.execute()


def teams(client: redis.Redis) -> list[str]:
    """Every team a job or a quota has named."""
    found = {text(team) for team in client.smembers(keys.TEAMS)}
    for queue in client.smembers(keys.QUEUES):
        found.update(text(team) for team in client.hkeys(keys.quota(text(queue))))
    return sorted(found)


def shared_stores(client: redis.Redis) -> list[str]:
    """The shared stores jobs have been submitted to."""
    return sorted(text(url) for url in client.smembers(keys.STORES))
