"""A worker's part in searches: when one of a search's trials pauses or ends here, this worker takes the
search's next step (``baton.searches.driver``: promotions, the next round of trials); the reaper's full
pass takes any step still due for every running search (a worker that died between recording its trial's
pause and taking the step leaves it to that pass)."""
from __future__ import annotations

import logging

import redis

from baton.storage.records import keys, searches
from baton.storage.records.connection import maybe_text
from baton.storage.records.job_records import JobRecords
from baton.storage.records.reaping import Publish
from baton.storage.stores.open import open_store

_log = logging.getLogger("baton.search")


def after_ending(client: redis.Redis, job_id: str, publish: Publish) -> None:
    """The job's attempt ended (paused, finished, failed): its search's next step, if it is a trial."""
    try:
        search_id = maybe_text(client.hget(keys.job(job_id), "sweep"))
        if search_id and client.exists(keys.search(search_id)):
            advance(client, search_id, publish)
    except redis.RedisError as exc:
        _log.warning("job %s: its search's next step is left to the reaper (%s: %s)", job_id, type(exc).__name__, exc)


def advance_running(client: redis.Redis, publish: Publish) -> None:
    """Every running search's next step, where one is due."""
    for search_id in searches.running(client):
        advance(client, search_id, publish)


def advance(client: redis.Redis, search_id: str, publish: Publish) -> None:
    records = JobRecords(client)
    try:
        from baton.searches.driver import Driver

        Driver(client, search_id, lambda job_id, attempt: records.publish_marked(job_id, attempt, publish),
               open_store).advance()
    except ImportError as exc:  # optuna: baton[search]
        _log.error("search %s: cannot decide its next step on this worker (%s; pip install 'baton[search]')",
                   search_id, exc)
    except Exception:  # noqa: BLE001 - a search's trouble must not end this worker's delivery or reaping
        _log.exception("search %s: its next step failed; the reaper's next pass tries again", search_id)
