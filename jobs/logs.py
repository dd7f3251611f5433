"""Where a job's log is read from for a user (``baton logs``, ``job.follow_logs()``): through its record
where it has one, else from its store alone; ``baton.storage.job_log`` reads the chunks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from baton.storage.job_log import FOLLOW_POLL_S, attempt_ended, follow_log, log_chunks, read_log
from baton.storage.layout import JobPaths
from baton.storage.stores.base import ObjectStore

if TYPE_CHECKING:
    from baton.schemas.settings import BatonSettings


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
