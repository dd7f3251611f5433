"""Which workers cannot host which waiting job: what the scheduler needs to know where a worker freed for
a job would be of use, and what a waiting job's status says when none can.

Two sources, neither of which lapses while nothing about the worker changes:

- what a worker offers every job (``baton.schemas.hosting.WorkerOffer``: shipped code, module prefixes,
  GPUs), announced with its queues, against what the job needs (``JobNeeds``, in its record): known
  before any worker meets the job, busy workers included;
- what a worker found when it met the job (``reception.cannot_host``: a package not installed here, a
  store it cannot reach), noted here with the worker's run (``note``): a "no" holds until that worker
  restarts (a new run, perhaps with more installed), or says yes.

A worker nobody has heard from (one started before workers announced their offer) is assumed able.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

import redis

from baton.schemas.hosting import WorkerOffer, lacking, read_needs
from baton.storage.records import keys, presence
from baton.storage.records.connection import maybe_text, text
from baton.storage.records.pool import Pool, Waiting

KEPT_S = 86400.0
"""How long a job's notes are kept after the last one (only to clean up: a note holds while its worker's run
is the one that said it)."""


# KEYS: the job's refusals. ARGV: worker, its run, seconds kept.
_NOTE = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""


def note(client: redis.Redis, job_id: str, worker: str, run: str) -> None:
    """``worker``, in its run ``run``, cannot host ``job_id`` (one script)."""
    client.register_script(_NOTE)(keys=[keys.job_refusals(job_id)], args=[worker, run, int(KEPT_S)])


def withdraw(client: redis.Redis, job_id: str, worker: str) -> None:
    """``worker`` can host ``job_id`` now: its earlier "no" goes."""
    client.hdel(keys.job_refusals(job_id), worker)


def read(client: redis.Redis, job_ids: list[str]) -> dict[str, frozenset[str]]:
    """The workers whose "no" to each of ``job_ids`` still holds: said in their current run (two round
    trips)."""
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hgetall(keys.job_refusals(job_id))
    notes = [{text(worker): text(run) for worker, run in found.items()} for found in pipe.execute()]
    current = presence.runs(client, sorted({worker for found in notes for worker in found}))
    return {job_id: frozenset(worker for worker, run in found.items() if current.get(worker) == run)
            for job_id, found in zip(job_ids, notes)}


@dataclass(frozen=True)
class Placement:
    """What the scheduler knows of where jobs can go: the live workers of the queue that take jobs (not
    drained), the worker each running job holds (whatever its queue), the workers that cannot host each
    waiting job, and what no live worker offers a job (``unmet``). Empty: every worker hosts all."""

    live: frozenset[str] = frozenset()
    worker_of: dict[str, str] = field(default_factory=dict)  # running job -> its (leading) worker
    refused: dict[str, frozenset[str]] = field(default_factory=dict)  # waiting job -> workers that cannot host it
    idle: frozenset[str] = frozenset()  # the live, undrained workers holding no job (a gang's followers not)
    unmet: dict[str, str] = field(default_factory=dict)  # waiting job -> what no live worker offers it
    served: int = 0  # live workers serving the queue, drained ones included

    def frees_for(self, running_job: str, waiting_job: str) -> bool:
        """Whether freeing ``running_job``'s worker may start ``waiting_job`` there (unknown: yes)."""
        worker = self.worker_of.get(running_job)
        return worker is None or worker not in self.refused.get(waiting_job, frozenset())

    def nowhere(self, waiting_job: str) -> bool:
        """Whether no live worker that takes jobs can host ``waiting_job`` (nothing freed would start it)."""
        return bool(self.live) and self.live <= self.refused.get(waiting_job, frozenset())

    def idle_refusing(self, waiting_job: str) -> int:
        """How many idle workers cannot host ``waiting_job``: free slots that would not start it."""
        return len(self.idle & self.refused.get(waiting_job, frozenset()))

    def idle_for(self, waiting_job: str) -> int:
        """How many idle workers can host ``waiting_job``."""
        return len(self.idle) - self.idle_refusing(waiting_job)

    def without(self, followers: Iterable[str]) -> "Placement":
        """The same, with ``followers`` (a gang's other nodes: busy, though no job names them) not idle."""
        return Placement(self.live, self.worker_of, self.refused, self.idle - frozenset(followers), self.unmet,
                         self.served)


HEADS = 256
"""The most waiting jobs of a queue whose hosts are looked up at once (a queue's start order, a status's jobs
ahead): those further back are assumed hostable until they come this far."""


def place(client: redis.Redis, queue: str, waiting: list[Waiting]) -> Placement:
    """Where ``queue``'s ``waiting`` jobs (the first ``HEADS``) can go now: its live workers, those drained, the
    job each holds, and which of them cannot host each waiting job, by what they offer and by what they said."""
    waiting = waiting[:HEADS]
    live = Pool(client).live_workers(queue)
    if not live:
        return Placement()
    held = [maybe_text(job) for job in client.hmget(keys.BUSY, live)]
    out = presence.drained(client, live)
    worker_of = {job: worker for worker, job in zip(live, held) if job is not None}
    taking = frozenset(worker for worker in live if worker not in out)  # (a drained worker starts nothing)
    idle = frozenset(worker for worker, job in zip(live, held) if job is None and worker in taking)
    refused = read(client, [job.job_id for job in waiting]) if waiting else {}
    unmet: dict[str, str] = {}
    groups: dict[WorkerOffer, set[str]] = {}  # (workers of one pool mostly offer the same: each offer once)
    for worker, offer in presence.offers(client, sorted(live)).items():
        groups.setdefault(offer, set()).add(worker)
    for job in waiting:
        needs = read_needs(job.needs)
        if needs is None:
            continue
        lack: set[str] = set()
        said = None
        for offer, workers in groups.items():
            lacks = lacking(needs, offer)
            if lacks is not None:
                lack |= workers
                said = said or lacks.needs
        refused[job.job_id] = refused.get(job.job_id, frozenset()) | (lack & taking)
        if said is not None and taking <= lack:
            drained_able = len(set(live) - taking - lack)
            unmet[job.job_id] = said + (f"; {drained_able} drained worker(s) do (`baton undrain WORKER`)"
                                        if drained_able else "")
    return Placement(taking, worker_of, refused, idle, unmet, len(live))


def unmet_reason(placement: Placement, queue: str, job_id: str, last_event: Optional[str] = None) -> Optional[str]:
    """What a waiting job's status says when no live worker of ``queue`` that takes jobs can host it (its
    ``last_event``: what the last worker that met it said)."""
    if not placement.nowhere(job_id):
        return None
    needs = placement.unmet.get(job_id)
    if needs is not None:
        return f"no live worker of queue {queue} {needs}"
    said = (last_event or "").partition("passed it on: ")[2]
    return f"no live worker of queue {queue} can host it" + (f" (the last to meet it: {said})" if said else
                                                              " (each found something missing when it met it)")
