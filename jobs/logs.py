"""Reading a job's own log (``baton logs``, ``job.logs()``): its attempts' chunks, in order.

Each attempt writes its lines under its own prefix (``jobs/<id>/attempt-<n>/logs/<chunk>.log``,
``workers/tracking/job_logs.py``); the log is a side output, found by listing, like TensorBoard's files.
Only the last chunk of an attempt still grows, so following a job re-reads just that one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from baton.storage.stores.base import ObjectStore
from baton.storage.layout import JobPaths, log_chunk_of

if TYPE_CHECKING:
    from baton.schemas.settings import BatonSettings

FOLLOW_POLL_S = 1.0
BATON_STREAM = "baton"
"""The stream name of the lines baton itself adds to a job's log (the others are stdout, stderr)."""
END_MARKER = "attempt {attempt} ended: "
"""The last line of every attempt whose process lived to its end (``baton logs -f`` stops after it
for a job with no record to ask)."""


def log_chunks(store: ObjectStore, job_id: str, attempt: Optional[int] = None) -> list[tuple[int, int, str]]:
    """``(attempt, chunk, key)`` of the job's log chunks (of one attempt if given), in order."""
    paths = JobPaths(job_id)
    prefix = paths.for_attempt(attempt).logs if attempt is not None else paths.attempts
    found = [(*where, key) for key in store.list(prefix) if (where := log_chunk_of(key)) is not None]
    return sorted(found)


def attempts(store: ObjectStore, job_id: str) -> list[int]:
    """The attempts that left a log."""
    return sorted({attempt for attempt, _, _ in log_chunks(store, job_id)})


def read_log(store: ObjectStore, job_id: str, attempt: Optional[int] = None) -> str:
    """The job's log: every attempt's lines (or one attempt's), oldest first."""
    parts = []
    for _, _, key in log_chunks(store, job_id, attempt):
        try:
            parts.append(store.get_bytes(key).decode("utf-8", errors="replace"))
        except FileNotFoundError:  # removed with the job meanwhile
            continue
    return "".join(parts)


def follow_log(store: ObjectStore, job_id: str, write: Callable[[str], None], done: Callable[[], bool],
               attempt: Optional[int] = None, poll_s: float = FOLLOW_POLL_S,
               timeout_s: Optional[float] = None) -> None:
    """Write the log as it grows, whole lines only, until ``done()`` (then once more, so the last
    flush is shown). ``done`` is asked before each read, so what it sees is covered by that read."""
    shown: dict[str, int] = {}  # key -> bytes written
    sealed: set[str] = set()  # chunks read whole after the next one appeared: they change no more
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        finished = done()
        chunks = log_chunks(store, job_id, attempt)
        last_of_attempt = {a: key for a, _, key in chunks}
        for a, _, key in chunks:
            if key in sealed:
                continue
            if key != last_of_attempt[a]:
                sealed.add(key)  # its last upload came before the next chunk's first: read it once more
            try:
                data = store.get_bytes(key)
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1
            if end > shown.get(key, 0):
                write(data[shown.get(key, 0):end].decode("utf-8", errors="replace"))
                shown[key] = end
        if finished or (deadline is not None and time.monotonic() > deadline):
            return
        time.sleep(poll_s)


def attempt_ended(store: ObjectStore, job_id: str) -> bool:
    """Whether the newest attempt's log ends with its end marker (no process writes it any more).
    For a job with no record to ask (``baton run``), this is when following it stops."""
    chunks = log_chunks(store, job_id)
    if not chunks:
        return False
    attempt, _, key = chunks[-1]
    try:
        tail = store.get_bytes(key)[-4096:].decode("utf-8", errors="replace")
    except FileNotFoundError:
        return False
    last = tail.rstrip("\n").rsplit("\n", 1)[-1]
    return f" {BATON_STREAM} {END_MARKER.format(attempt=attempt)}" in last


@dataclass
class JobLog:
    """Where a job's log is read from, and how to know that nothing more will come (``stopped``
    then says why, where the reason is not the job's own end)."""

    store: ObjectStore
    job_id: str
    done: Callable[[], bool]
    stopped: Optional[str] = None

    def read(self, attempt: Optional[int] = None) -> str:
        return read_log(self.store, self.job_id, attempt)

    def follow(self, attempt: Optional[int], write: Callable[[str], None], poll_s: float = FOLLOW_POLL_S) -> None:
        follow_log(self.store, self.job_id, write, self.done, attempt, poll_s)


def open_job_log(job_id: str, storage_url: Optional[str], settings: "BatonSettings") -> JobLog:
    """The job's record decides its store and when it is over (its state is terminal); without one
    (a ``baton run`` job, ``storage_url`` given, or no Redis to ask) the store alone: then following
    ends with the newest attempt's log. FileNotFoundError if the store holds no such job."""
    import redis

    from baton.schemas.errors import JobNotFound
    from baton.storage.stores.open import open_client_store

    JobPaths(job_id)  # ValueError for an id no job can have
    if storage_url is None:
        from baton.jobs.client import JobClient

        try:
            job = JobClient().job(job_id)
            return JobLog(job._store(), job_id, lambda: job.status().state.terminal)
        except (JobNotFound, redis.RedisError):
            storage_url = settings.storage_url
    store = open_client_store(storage_url)
    if not store.exists(JobPaths(job_id).spec) and not log_chunks(store, job_id):
        raise FileNotFoundError(f"no job {job_id!r} (no record, and nothing under {store.url}/{JobPaths(job_id).root})")
    log = JobLog(store, job_id, lambda: False)
    log.done = lambda: _run_over(log)
    return log


def _run_over(log: JobLog) -> bool:
    """A job with no record is over when its newest attempt's log has its end line, or when no live
    ``baton run`` holds it (the process writing it was killed outright, or none runs it now)."""
    from baton.storage.run_lease import held

    if attempt_ended(log.store, log.job_id):
        return True
    if not held(log.store, JobPaths(log.job_id)):
        log.stopped = (f"job {log.job_id}: no run holds it now (its process is gone, or it is not running): "
                       "stopped following; `baton run` with its --id resumes it")
        return True
    return False
