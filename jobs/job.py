"""A handle on one job (``JobClient.submit`` and ``JobClient.job`` return them): its status, its wait,
its history, cancel, resume and priority, and what it left in the store (metrics, logs, report, files)."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from tqdm import tqdm

from baton.jobs.downloads import download
from baton.schemas.errors import JobNotFound
from baton.schemas.manifest import CheckpointManifest
from baton.schemas.status import JobStatus
from baton.storage.artifacts import final_files, read_metrics, read_verified
from baton.storage.job_log import FOLLOW_POLL_S, follow_log, read_log
from baton.storage.layout import JobPaths
from baton.storage.manifest_store import ManifestStore
from baton.storage.records import events, keys
from baton.storage.records.pausing import continue_job
from baton.storage.records.priority import set_priority
from baton.storage.records.teams import max_priority
from baton.jobs.roles import within_limit
from baton.storage.stores.base import ObjectStore
from baton.storage.stores.open import open_client_store

if TYPE_CHECKING:
    from baton.jobs.client import JobClient

POLL_S = 0.5


class Job:
    """A handle on one job."""

    def __init__(self, client: "JobClient", job_id: str):
        self.client, self.id = client, job_id

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def status(self) -> JobStatus:
        return self.client.records.status(self.id)

    def wait(self, timeout: Optional[float] = None, progress: bool = True,
             on_change: Optional[Callable[[JobStatus], None]] = None) -> JobStatus:
        """Block until the job ends (succeeded, failed, cancelled) or pauses; TimeoutError after ``timeout`` s.
        ``progress``: a live bar on a terminal (steps, loss, samples/s, attempt and worker).
        ``on_change``: called with the status whenever its state, attempt, worker or epoch changes, or
        the reason it waits (``status.waiting``: no live worker serves its queue)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        bar, seen = None, None
        try:
            while True:
                status = self.status()
                if progress and sys.stderr.isatty():
                    bar = _draw(bar, status)
                key = (status.state, status.attempt, status.worker, status.epoch, status.waiting)
                if on_change is not None and key != seen:
                    seen = key
                    on_change(status)
                if status.state.at_rest:
                    return status
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {self.id} still {status.state.value} after {timeout}s")
                time.sleep(POLL_S)
        finally:
            if bar is not None:
                bar.close()

    def events(self) -> list[events.Event]:
        """The job's history, oldest first: submitted, claimed, yielded, lost, resumed, paused, ended...
        each with its time, attempt, worker, step and words (the latest 500, while Redis holds the job)."""
        if not self.client.records.redis.exists(keys.job(self.id)):
            raise JobNotFound(f"no job {self.id!r}")
        return events.events(self.client.records.redis, self.id)

    def cancel(self) -> str:
        """Stop the job: at once if it waits for a worker, else at its next step after a checkpoint."""
        result = self.client.records.cancel(self.id)
        if result == "missing":
            raise JobNotFound(f"no job {self.id!r}")
        return result

    def resume(self, pause_at: Optional[int] = None) -> int:
        """Queue a cancelled, failed or paused job again from its latest checkpoint; returns the attempt.
        ``pause_at``: where it pauses next, as in ``JobClient.submit`` (None: it trains to its end)."""
        attempt = continue_job(self.client.records.redis, self.id, pause_at, "continued by the user")
        if attempt < 0:
            if pause_at is not None:
                raise ValueError(f"job {self.id}: {self.status().state.value}; only a paused job resumes to pause again")
            attempt = self.client.records.resume(self.id)
        if attempt < 0:
            raise ValueError(f"job {self.id}: {self.status().state.value}; only cancelled, failed or paused jobs resume")
        self.client._publish(self.id, attempt)
        return attempt

    def set_priority(self, priority: int) -> None:
        """Change the priority of a waiting or running job: a waiting one takes its new place in its line,
        a running one is weighed at it by the scheduler (its spec keeps the priority it was submitted with).
        ValueError for a job that has ended, a priority out of range, or one above its team's max priority."""
        team = self.status().team
        problem = within_limit(priority, team, max_priority(self.client.records.redis, team))
        if problem is not None:
            raise ValueError(f"job {self.id}: {problem}")
        result = set_priority(self.client.records.redis, self.id, priority)
        if result == "missing":
            raise JobNotFound(f"no job {self.id!r}")
        if result != "ok":
            raise ValueError(f"job {self.id}: {result}; only a waiting or running job's priority can change")

    def _store(self) -> ObjectStore:
        status = self.status()
        return open_client_store(status.storage_url or self.client.settings.storage_url)

    def _manifest(self, store: ObjectStore) -> CheckpointManifest:
        return ManifestStore(store, JobPaths(self.id)).read()

    def metrics(self) -> list[dict]:
        """One row per validation so far (the committed metrics.jsonl, found through the manifest)."""
        store = self._store()
        return read_metrics(store, self._manifest(store))

    def logs(self, attempt: Optional[int] = None) -> str:
        """The job's own log (every line its attempts printed or logged, secrets redacted), oldest
        first; one attempt's with ``attempt``. Lines are stored every few seconds while it runs."""
        return read_log(self._store(), self.id, attempt)

    def follow_logs(self, write: Callable[[str], None] = lambda text: print(text, end="", flush=True),
                    attempt: Optional[int] = None, poll_s: float = FOLLOW_POLL_S) -> JobStatus:
        """Write the log as it grows until the job ends (its attempts one after another); returns its status."""
        follow_log(self._store(), self.id, write, lambda: self.status().state.terminal, attempt, poll_s)
        return self.status()

    def report(self) -> dict:
        store = self._store()
        return json.loads(read_verified(store, final_files(self._manifest(store))["report.json"]))

    def download(self, directory: str | Path = ".", which: str = "best") -> Path:
        """Fetch ``best`` or ``latest`` (a full checkpoint) or ``final`` (model.safetensors,
        report.json, curves.png, metrics.jsonl), each verified against the sha256 its manifest
        entry holds, or ``tensorboard`` (every attempt's event files, under ``tensorboard/attempt-N/``;
        not in the manifest, so not verified); returns the path."""
        return download(self._store(), self.id, directory, which)


def _draw(bar: Optional[tqdm], status: JobStatus) -> tqdm:
    if bar is None:
        bar = tqdm(total=status.total_steps or 0, unit="step", dynamic_ncols=True, desc=status.id)
    if status.total_steps and bar.total != status.total_steps:
        bar.total = status.total_steps
    bar.n = status.step or 0
    bar.set_postfix_str(f"{status.state.value} attempt {status.attempt} on {status.worker or '-'} "
                        f"loss {status.loss if status.loss is not None else float('nan'):.4f} "
                        f"{status.samples_per_s or 0:.0f} samples/s"
                        + (f"; {status.waiting}" if status.waiting else ""), refresh=True)
    return bar
