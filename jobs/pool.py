"""A user's view of a queue's pool: the waiting jobs in the order they will start and why each waits, the
running jobs with their workers, each team's use against its quota (``baton queue``, ``baton quota``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from baton.schemas.errors import JobNotFound
from baton.schemas.spec import NAME_PATTERN
from baton.schemas.status import JobStatus
from baton.storage.records import keys, presence, refusals
from baton.storage.records.job_records import JobRecords
from baton.storage.records.pool import QueueState, why_waiting


@dataclass(frozen=True)
class QueueView:
    state: QueueState
    reasons: dict[str, str]  # waiting job id -> why it waits
    running: list[JobStatus]
    workers: list[str]  # live workers serving the queue
    drained: set[str]  # those of them drained (``baton drain``): they take no job
    yielded: frozenset[str] = frozenset()  # the waiting jobs that yielded their worker (queued again, nothing lost)

    @property
    def queue(self) -> str:
        return self.state.queue


def queue_views(records: JobRecords, queue: Optional[str] = None) -> list[QueueView]:
    """``queue``, or every queue a job has waited on or a worker served."""
    pool = records.pool
    views = []
    for name in [queue] if queue is not None else pool.queues():
        state, workers = pool.state(name), pool.live_workers(name)
        unserved = f"no live worker serves queue {name!r}" if not workers else None
        drained = presence.drained(records.redis, workers)
        placement = refusals.place(records.redis, name, state.waiting)
        reasons = {job.job_id: unserved or refusals.unmet_reason(placement, name, job.job_id)
                   or why_waiting(state, job, placement) for job in state.waiting}
        running = []
        for job in state.running:
            try:
                running.append(records.status(job.job_id))
            except JobNotFound:
                continue
        pipe = records.redis.pipeline(transaction=False)
        for waiting in state.waiting:
            pipe.hget(keys.job(waiting.job_id), "yielded")
        yielded = frozenset(waiting.job_id for waiting, mark in zip(state.waiting, pipe.execute() if state.waiting
                                                                    else []) if mark)
        views.append(QueueView(state, reasons, running, workers, drained, yielded))
    return views


def check_quota(queue: str, team: str, slots: Optional[int] = None) -> None:
    """ValueError naming what is wrong with a quota's queue, team or slots."""
    import re

    problems = [f"{what}: {value!r} is not a name (letters, digits, '.', '_', '-'; at most 64)"
                for what, value in (("--queue", queue), ("TEAM", team)) if not re.match(NAME_PATTERN, value)]
    if slots is not None and slots < 0:
        problems.append(f"--slots: {slots} is below 0")
    if problems:
        raise ValueError("; ".join(problems))


def drain(records: JobRecords, worker: str, drained: bool) -> tuple[str, bool]:
    """Drain ``worker`` (its job yields at its next step, it takes no other) or undrain it: the worker's
    full name (``name@host``; ``name`` alone when one live worker has it) and whether anything changed.
    ValueError naming the live workers when no live worker has that name."""
    live = presence.live_workers(records.redis)
    matches = [w for w in live if w == worker] or [w for w in live if w.split("@", 1)[0] == worker]
    if len(matches) != 1:
        known = ", ".join(live) if live else "none"
        what = "several live workers are named" if matches else "no live worker is named"
        raise ValueError(f"{what} {worker!r} (live workers: {known})")
    return matches[0], presence.set_drained(records.redis, matches[0], drained)
