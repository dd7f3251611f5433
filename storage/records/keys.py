"""Every Redis key baton uses, built in one place."""
from __future__ import annotations

PREFIX = "baton"

JOBS_INDEX = f"{PREFIX}:jobs"
"""Sorted set of every job id, scored by submission time."""
ACTIVE = f"{PREFIX}:active"
"""Set of the ids of jobs not yet finished (queued, running, retrying): what the reaper scans."""


LEASES_DUE = f"{PREFIX}:leases:due"
"""Sorted set of the running jobs' ids, each scored by the Redis time (ms) its lease expires at unless
renewed: the reaper looks only at those past it (every claim and renewal moves the score)."""
REAPER_SWEPT = f"{PREFIX}:reaper:swept"
"""Held from one full pass over ``ACTIVE`` until the next is due (``reaping.SWEEP_EVERY_S``)."""
REAPER_TURN = f"{PREFIX}:reaper:turn"
"""Held by the worker whose reaper makes the passes: it keeps it each period, and it lapses two periods
after that worker stops keeping it (``reaping.take_turn``)."""
REDIS_RUN_ID = f"{PREFIX}:redis:run_id"
"""The Redis server's ``run_id`` as the last reaper turn saw it: one that differs (or is missing on a
server just started) means Redis restarted, however quickly."""
REDIS_OUTAGE = f"{PREFIX}:redis:outage"
"""Set (for a lease TTL and a reaper period) by a worker that found Redis unreachable and reached it
again: a lease that lapsed meanwhile lapsed because of Redis, and is not counted as a worker loss."""


TEAM_MAX_PRIORITY = f"{PREFIX}:teams:max_priority"
"""Hash: team -> the highest priority its jobs may have (``records/teams.py``)."""
AUDIT = f"{PREFIX}:audit"
"""List: the audit trail's recent entries, newest first, bounded (``records/audit.py``)."""
PRINCIPALS = f"{PREFIX}:principals"
"""Set of every principal's name."""
TOKENS = f"{PREFIX}:tokens"
"""Hash: the SHA-256 of every principal's token -> the principal's name (``records/principals.py``)."""


def principal(name: str) -> str:
    """Hash: a principal's role, teams, whether it is a service, when it was made, its token's SHA-256."""
    return f"{PREFIX}:principal:{name}"


def job(job_id: str) -> str:
    """Hash: the job's record (spec, state, attempt, progress, pointers, error)."""
    return f"{PREFIX}:job:{job_id}"


def lease(job_id: str) -> str:
    """String ``<attempt>:<worker>:<claim nonce>`` with a TTL: present while a live worker holds the job."""
    return f"{PREFIX}:job:{job_id}:lease"


def job_events(job_id: str) -> str:
    """List: the job's events, oldest first, each a JSON object (``storage/records/events.py``)."""
    return f"{PREFIX}:job:{job_id}:events"


def job_live(job_id: str) -> str:
    """List: the job's live training points, ``<step> <loss> <lr> <unix s>`` (``storage/records/events.py``)."""
    return f"{PREFIX}:job:{job_id}:live"


def sweep(sweep_id: str) -> str:
    """Sorted set of the ids of a sweep's jobs, scored by their place in the grid (a search's: by trial number)."""
    return f"{PREFIX}:sweep:{sweep_id}"


SEARCHES = f"{PREFIX}:searches"
"""Set of the ids of searches not yet finished: what the reaper pokes."""


def search(search_id: str) -> str:
    """Hash: a search's base spec, search file, unit, end, state and best trial (``storage/records/searches.py``)."""
    return f"{PREFIX}:search:{search_id}"


def search_part(search_id: str, part: str) -> str:
    """A search's ``rungs`` (hash: rung -> its decision), ``values`` (hash: "trial:rung" -> metric), ``lock``
    (string: whoever decides its next step) and ``pokes`` (counter: a trial changed since)."""
    return f"{PREFIX}:search:{search_id}:{part}"


def worker_stopping(worker: str) -> str:
    """Set while the worker named ``worker`` is shutting down (its jobs checkpoint and leave)."""
    return f"{PREFIX}:worker:{worker}:stopping"


def worker_drained(worker: str) -> str:
    """Set while the worker named ``worker`` is drained (``baton drain``): its job yields, it takes no other."""
    return f"{PREFIX}:worker:{worker}:drained"


def queue_workers(queue: str) -> str:
    """Sorted set of the workers serving ``queue``, each scored by the Redis time (s) its announcement
    lapses at: a worker that stops announcing (gone, SIGKILLed) drops out by itself."""
    return f"{PREFIX}:queue:{queue}:workers"


def gang(job_id: str) -> str:
    """Hash: the gang of workers forming for, or running, an attempt of a multi-node job; it expires
    unless its leader renews it (``storage/records/gangs.py``)."""
    return f"{PREFIX}:job:{job_id}:gang"


def gang_member(job_id: str, node: int) -> str:
    """String: the lease of the worker that joined a job's gang as node ``node`` (1..N-1), with a TTL."""
    return f"{PREFIX}:job:{job_id}:gang:{node}"


def queue_forming(queue: str) -> str:
    """String ``<job>:<attempt>`` with a TTL: the one gang forming on ``queue`` (none may wait beside it)."""
    return f"{PREFIX}:queue:{queue}:forming"


def queue_waiting(queue: str, team: str) -> str:
    """Sorted set of ``team``'s jobs waiting on ``queue``, each ``<submit ms>:<job id>`` scored by minus its
    priority: the team's line, in the order its jobs start (``storage/records/pool.py``)."""
    return f"{PREFIX}:queue:{queue}:waiting:{team}"


def job_refusals(job_id: str) -> str:
    """Hash: worker -> when it last found it cannot host the waiting job (GPUs, modules, its store):
    where the scheduler does not free a worker for it (``storage/records/refusals.py``)."""
    return f"{PREFIX}:job:{job_id}:refused"


def queue_teams(queue: str) -> str:
    """Set of the teams that may have jobs waiting on ``queue``."""
    return f"{PREFIX}:queue:{queue}:teams"


def queue_running(queue: str) -> str:
    """Hash: job id -> ``<team> <slots> <priority>`` for each job holding workers of ``queue``."""
    return f"{PREFIX}:queue:{queue}:running"


def queue_cooling(queue: str) -> str:
    """Sorted set: job id -> when the scheduler last asked it to yield, for ``queue``'s jobs asked within
    the cooldown (``scheduling.YIELD_COOLDOWN_S``): what a turn reads instead of every running job's record."""
    return f"{PREFIX}:queue:{queue}:cooling"


def queue_yielding(queue: str) -> str:
    """Hash: job id -> why it was asked to yield, for each running job of ``queue`` the scheduler asked
    (``storage/records/scheduling.py``); the mark goes when the attempt ends."""
    return f"{PREFIX}:queue:{queue}:yielding"


def queue_usage(queue: str) -> str:
    """Hash: team -> the worker slots its running jobs hold on ``queue``."""
    return f"{PREFIX}:queue:{queue}:usage"


def quota(queue: str) -> str:
    """Hash: team -> the worker slots of ``queue`` guaranteed to it (``baton quota``)."""
    return f"{PREFIX}:queue:{queue}:quota"


BUSY = f"{PREFIX}:busy"
"""Hash: worker -> the job it holds, from its claim to the end of that attempt: a live worker not in it
is idle (the scheduler's measure of free slots)."""

WORKERS_SEEN = f"{PREFIX}:workers:seen"
"""Hash: worker -> ``{"t": its last announcement (Redis time, s), "queues": [...]}``: the dashboard's list of
workers, the lost ones included (``presence.seen``)."""
WORKER_OFFERS = f"{PREFIX}:workers:offers"
"""Hash: worker -> what it offers every job (``baton.schemas.hosting.WorkerOffer``, JSON), as it last announced."""
WORKER_RUNS = f"{PREFIX}:workers:runs"
"""Hash: worker -> its current run (set as it starts): a "no" it said to a job (``job_refusals``) holds while
its run is the same."""

SCHEDULER_TURNS = f"{PREFIX}:scheduler:turns"
"""Counter: the scheduler's turns made so far (one a reaper period, by the worker holding the turn): what one
waits on to know that the scheduler has looked, N times, at what it now holds."""
TEAMS = f"{PREFIX}:teams"
"""Set of every team a job has been submitted for (``resources.team``): what ``baton quota set`` checks a name against."""
STORES = f"{PREFIX}:stores"
"""Set of the shared stores (not ``file://``) jobs have been submitted to: a worker started without a store of its
own (BATON_STORAGE_URL) refuses to start where the pool names one."""
QUEUES = f"{PREFIX}:queues"
"""Set of every queue a job has waited on or a worker has served: what ``baton queue`` and ``baton quota
list`` go through."""
