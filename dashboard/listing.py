"""The jobs page's rows: every job in Redis (read in one pipelined round trip of the fields a row shows)
and every job its store holds that Redis does not (a ``baton run`` job, or one whose record Redis lost),
filtered, sorted and cut into pages.

The store is listed at most every ``STORE_LIST_EVERY_S`` (a listing of 10,000 jobs takes seconds on S3);
a store-only job's row comes from its ``spec.json`` and ``manifest.json``, read once and kept while the
job is finished.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import redis

from baton.schemas.manifest import CheckpointManifest
from baton.storage.layout import JOBS_PREFIX, JobPaths, job_id_of_spec
from baton.storage.records import keys
from baton.storage.records.connection import text
from baton.storage.stores.base import ObjectStore

ROW_FIELDS = ("name", "state", "team", "priority", "queue", "attempt", "lost", "step", "total_steps", "epoch",
              "epochs", "monitor", "best_value", "val_loss", "worker", "created_at", "updated_at", "sweep", "loss",
              "yielded", "submitted_by")
SORTABLE = ("created_at", "updated_at", "name", "state", "team", "priority", "queue", "step", "best_value", "attempt")
STORE_LIST_EVERY_S = 30.0
PAGE_MAX = 500


def _number(value: Optional[str]) -> Optional[float]:
    try:
        number = None if value is None else float(value)
    except ValueError:
        return None
    return int(number) if number is not None and number.is_integer() and abs(number) < 2**53 else number


def _read(client: redis.Redis, ids: list[str]) -> dict[str, dict[str, Any]]:
    """The rows of ``ids``, read in one pipelined round trip (an id whose record is gone is left out)."""
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(keys.job(job_id), ROW_FIELDS)
    rows = {}
    for job_id, values in zip(ids, pipe.execute()):
        if values[1] is None:  # no record any more
            continue
        row: dict[str, Any] = {"id": job_id, "source": "redis"}
        for name, raw in zip(ROW_FIELDS, values):
            value = None if raw is None else text(raw)
            row[name] = _number(value) if name in _NUMERIC else value
        rows[job_id] = row
    return rows


TERMINAL = ("succeeded", "failed", "cancelled")
FULL_READ_EVERY_S = 60.0


class RedisRows:
    """A row per job Redis holds, newest first. A finished job's row is kept between requests: each request
    reads the index, the set of unfinished jobs and the rows of those (a job resumed is unfinished again),
    so the page costs the running jobs, not the history; every row is read again every ``FULL_READ_EVERY_S``
    (a record changed by hand)."""

    def __init__(self, client: redis.Redis):
        self.client = client
        self._rows: dict[str, dict[str, Any]] = {}
        self._read_all_at = -float("inf")
        self._lock = threading.Lock()

    def rows(self) -> list[dict[str, Any]]:
        # Redis is read outside the lock: a Redis that hangs holds each request for its own timeout, not
        # every request behind the one before
        pipe = self.client.pipeline(transaction=False)
        pipe.zrevrange(keys.JOBS_INDEX, 0, -1)
        pipe.smembers(keys.ACTIVE)
        listed, active = pipe.execute()
        ids = [text(job_id) for job_id in listed]
        unfinished = {text(job_id) for job_id in active}
        with self._lock:
            kept = self._rows
            if time.monotonic() - self._read_all_at >= FULL_READ_EVERY_S:
                kept, self._read_all_at = {}, time.monotonic()
        stale = [job_id for job_id in ids if job_id in unfinished or job_id not in kept
                 or kept[job_id]["state"] not in TERMINAL]
        fresh = _read(self.client, stale)
        known = set(ids)
        rows = {job_id: row for job_id, row in kept.items() if job_id in known and job_id not in stale}
        rows.update(fresh)
        with self._lock:
            self._rows = rows
        return [rows[job_id] for job_id in ids if job_id in rows]


_NUMERIC = {"priority", "attempt", "lost", "step", "total_steps", "epoch", "epochs", "best_value", "val_loss",
            "created_at", "updated_at", "loss"}


def store_row(store: ObjectStore, job_id: str) -> Optional[dict[str, Any]]:
    """A row for a job known only to the store: its spec and manifest."""
    paths = JobPaths(job_id)
    try:
        spec = json.loads(store.get_bytes(paths.spec))
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(spec, dict):
        return None
    manifest: Optional[CheckpointManifest] = None
    try:
        manifest = CheckpointManifest.model_validate_json(store.get_bytes(paths.manifest))
    except (FileNotFoundError, ValueError):
        pass
    return {"id": job_id, "source": "store", "attempt": manifest.attempt if manifest else None,
            **store_fields(spec, manifest)}


def store_fields(spec: dict, manifest: Optional[CheckpointManifest]) -> dict[str, Any]:
    """What a job's spec and manifest in its store tell of it, read as anyone who can write there may have
    written them: a value of the wrong type is left out."""
    resources = _section(spec, "resources")
    latest = manifest.latest if manifest is not None else None
    return {"name": _text(spec.get("name")),
            "state": "succeeded" if manifest is not None and manifest.completed else "stored",
            "team": _text(resources.get("team", "default")), "priority": _int(resources.get("priority", 0)),
            "queue": _text(resources.get("queue", "default")),
            "step": latest.step if latest is not None else None,
            "monitor": _text(_section(spec, "checkpoint").get("monitor")),
            "best_value": manifest.best.value if manifest is not None and manifest.best is not None else None,
            "created_at": min(c.created_at for c in manifest.checkpoints) if manifest and manifest.checkpoints else None,
            "updated_at": latest.created_at if latest is not None else None}


def _section(spec: dict, name: str) -> dict:
    """A section of a spec read from a store (which anyone who can write there may have written)."""
    value = spec.get(name)
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


LISTING_SHARE = 0.05
"""The most of its time the server spends listing the store: a store whose listing takes seconds (tens of
thousands of jobs) is listed less often, so the requests it slows stay rare."""


def next_listing_in(every_s: float, took_s: float) -> float:
    """Seconds to the next listing of the store, after one that took ``took_s``."""
    return max(every_s, took_s / LISTING_SHARE - took_s)


class StoreHistory:
    """The store's jobs that Redis does not hold, refreshed by a background thread every ``every_s``:
    a request never waits for a listing. A finished job's row is read once and kept."""

    def __init__(self, store: Callable[[], ObjectStore], known: Callable[[], set[str]],
                 every_s: float = STORE_LIST_EVERY_S):
        self._store, self._known, self.every_s = store, known, every_s
        self._rows: dict[str, dict[str, Any]] = {}
        self._done: dict[str, dict[str, Any]] = {}
        self.error: Optional[str] = None
        self._stop = threading.Event()

    def refresh(self) -> None:
        store, known = self._store(), self._known()
        found = (job_id_of_spec(key) for key in store.list(JOBS_PREFIX) if key.endswith("/spec.json"))
        rows = {}
        for job_id in sorted(job_id for job_id in found if job_id and job_id not in known):
            try:
                row = self._done.get(job_id) or store_row(store, job_id)
            except (ValueError, TypeError, AttributeError):  # a manifest that does not parse: left out
                continue
            if row is None:
                continue
            if row["state"] == "succeeded":
                self._done[job_id] = row
            rows[job_id] = row
        self._rows = rows

    def start(self) -> None:
        def loop() -> None:
            while True:
                started = time.monotonic()
                try:
                    self.refresh()
                    self.error = None
                except Exception as exc:  # an unreachable store: said on the page, tried again
                    self.error = f"{type(exc).__name__}: {exc}"
                if self._stop.wait(next_listing_in(self.every_s, time.monotonic() - started)):
                    return

        threading.Thread(target=loop, name="baton-ui-store-history", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def rows(self, known: set[str]) -> list[dict[str, Any]]:
        """Rows for the store's jobs that are not in ``known`` (Redis's)."""
        return [row for job_id, row in list(self._rows.items()) if job_id not in known]


@dataclass(frozen=True)
class Query:
    state: Optional[str] = None
    team: Optional[str] = None
    queue: Optional[str] = None
    name: Optional[str] = None  # a part of the name or id
    sort: str = "created_at"
    descending: bool = True
    offset: int = 0
    limit: int = 50


def select(rows: list[dict[str, Any]], query: Query) -> dict[str, Any]:
    """One page of ``rows`` as the query asks, with the total that matched."""
    wanted = [row for row in rows
              if (query.state is None or row.get("state") == query.state)
              and (query.team is None or row.get("team") == query.team)
              and (query.queue is None or row.get("queue") == query.queue)
              and (query.name is None or query.name.lower() in f"{row.get('name') or ''} {row['id']}".lower())]
    key = query.sort if query.sort in SORTABLE else "created_at"
    present = [row for row in wanted if row.get(key) is not None]
    absent = [row for row in wanted if row.get(key) is None]
    present.sort(key=lambda row: (row[key], row["id"]), reverse=query.descending)
    ordered = present + absent
    limit = max(1, min(query.limit, PAGE_MAX))
    return {"total": len(ordered), "offset": query.offset, "limit": limit,
            "jobs": ordered[max(0, query.offset):max(0, query.offset) + limit]}
