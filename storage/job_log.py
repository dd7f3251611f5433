"""A job's own log in object storage: its markers, and reading it (``baton logs``, ``job.logs()``): its
attempts' chunks, in order.

Each attempt writes its lines under its own prefix (``jobs/<id>/attempt-<n>/logs/<chunk>.log``,
``workers/tracking/job_logs.py``); the log is a side output, found by listing, like TensorBoard's files.
Only the last chunk of an attempt still grows, so following a job re-reads just that one.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from baton.storage.stores.base import ObjectStore
from baton.storage.layout import JobPaths, log_chunk_of

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
