"""Which workers cannot host which waiting job, as the workers found it: what the scheduler needs to
know where a worker freed for a job would be of use.

A worker that takes a message reads the first waiting jobs of its queue and asks of each whether it
can host it (``reception.cannot_host``: GPUs for each rank, modules it may import, the job's store).
Each "no" is noted here (``note``), with its time; the scheduler reads the notes of the jobs it would
free workers for (``read``) and takes no slot from a worker that said no within ``KEPT_S``, nor frees
any worker for a job that every live worker of its queue said no to. A worker nobody has heard from
is assumed able: the first yield for a job may free a worker that cannot host it (it then says so,
and starts the next job it can), never a second on that worker.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import redis

from baton.storage.records import keys
from baton.storage.records.connection import text

KEPT_S = 600.0
"""How long a worker's "no" stands (a worker restarted with more GPUs or modules may host the job since;
the note lapses, and the scheduler assumes it can again)."""


# KEYS: the job's refusals. ARGV: worker, seconds kept. Stamped with Redis's clock (every reader shares it).
_NOTE = """
redis.call('HSET', KEYS[1], ARGV[1], redis.call('TIME')[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""


def note(client: redis.Redis, job_id: str, worker: str) -> None:
    """``worker`` cannot host ``job_id`` (one script; the notes of a job go ``KEPT_S`` after the last)."""
    client.register_script(_NOTE)(keys=[keys.job_refusals(job_id)], args=[worker, int(KEPT_S)])


def withdraw(client: redis.Redis, job_id: str, worker: str) -> None:
    """``worker`` can host ``job_id`` now (restarted with more GPUs, say): its earlier "no" goes."""
    client.hdel(keys.job_refusals(job_id), worker)


def read(client: redis.Redis, job_ids: list[str]) -> dict[str, frozenset[str]]:
    """The workers that said no to each of ``job_ids`` within ``KEPT_S`` (two round trips)."""
    seconds, _ = client.time()
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hgetall(keys.job_refusals(job_id))
    since = seconds - KEPT_S
    out = {}
    for job_id, notes in zip(job_ids, pipe.execute()):
        fresh = set()
        for worker, at in notes.items():
            try:
                if float(text(at)) >= since:
                    fresh.add(text(worker))
            except ValueError:
                continue
        out[job_id] = frozenset(fresh)
    return out


@dataclass(frozen=True)
class Placement:
    """What the scheduler knows of where jobs can go: the live workers of the queue that take jobs (not
    drained), the worker each running job holds, and the workers that said no to each waiting job.
    Empty: every worker hosts all."""

    live: frozenset[str] = frozenset()
    worker_of: dict[str, str] = field(default_factory=dict)  # running job -> its (leading) worker
    refused: dict[str, frozenset[str]] = field(default_factory=dict)  # waiting job -> workers that said no
    idle: frozenset[str] = frozenset()  # the live, undrained workers holding no job (a gang's followers not)

    def frees_for(self, running_job: str, waiting_job: str) -> bool:
        """Whether freeing ``running_job``'s worker may start ``waiting_job`` there (unknown: yes)."""
        worker = self.worker_of.get(running_job)
        return worker is None or worker not in self.refused.get(waiting_job, frozenset())

    def nowhere(self, waiting_job: str) -> bool:
        """Whether every live worker said no to ``waiting_job`` (nothing freed would start it)."""
        return bool(self.live) and self.live <= self.refused.get(waiting_job, frozenset())

    def idle_refusing(self, waiting_job: str) -> int:
        """How many idle workers said no to ``waiting_job``: free slots that would not start it."""
        return len(self.idle & self.refused.get(waiting_job, frozenset()))
