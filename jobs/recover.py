"""Rebuilding job records lost with Redis from what object storage still holds.

A Redis without persistence that restarts (or is flushed) loses every job record while the
checkpoints survive in the store: ``submit`` with the same id is then refused (its spec.json
exists) and ``resume`` has no record to work on. Each job's prefix holds what a record needs:
``spec.json`` (written at submit) and ``manifest.json`` (its committed checkpoints, whether it
completed, and the newest attempt that claimed it).

- A completed manifest gives a ``succeeded`` record.
- Anything else is queued again as a new attempt, which resumes from the latest good checkpoint.
  Its number skips one past the manifest's attempt: an attempt may have been claimed in the lost
  Redis without reaching the manifest yet, and the manifest's compare-and-swap must fence that
  one out as well.
- A job that still has a record is left alone (the record is newer than anything stored).

The store keeps no record of a job that had *failed* or been *cancelled*: such a job is queued
again too (``baton cancel`` it if that was not wanted).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from baton.schemas.errors import JobNotFound, SpecError
from baton.schemas.spec import JobSpec
from baton.schemas.status import JobState
from baton.storage.stores.base import ObjectStore
from baton.storage.layout import JOBS_PREFIX, JobPaths, job_id_of_spec
from baton.storage.manifest_store import ManifestStore

from baton.storage.records.job_records import JobRecords, spec_fields

ATTEMPTS_SKIPPED = 1
"""Attempt numbers left out past the manifest's: one may have been claimed in the lost Redis."""

Publish = Callable[[str, int], None]  # (job id, attempt): the outbox's publish for a marked record


@dataclass(frozen=True)
class Recovered:
    job_id: str
    action: str  # "queued" | "succeeded" | "present" (it still has a record: left alone) | "skipped"
    attempt: int  # the attempt queued, the one that finished, or the record's current one
    step: Optional[int] = None  # the latest committed checkpoint's step
    reason: str = ""  # why it was skipped

    def describe(self) -> str:
        if self.action == "queued":
            start = f"from step {self.step}" if self.step is not None else "from the start"
            return f"{self.job_id}: record rebuilt, queued as attempt {self.attempt} ({start})"
        if self.action == "succeeded":
            return f"{self.job_id}: record rebuilt as succeeded (attempt {self.attempt}, step {self.step})"
        if self.action == "skipped":
            return f"{self.job_id}: skipped: {self.reason}"
        return f"{self.job_id}: has a record (attempt {self.attempt}); left alone"


def stored_job_ids(store: ObjectStore) -> list[str]:
    """Every job whose spec.json the store holds, sorted."""
    return sorted({job_id for key in store.list(JOBS_PREFIX) if (job_id := job_id_of_spec(key)) is not None})


def _progress_fields(manifest) -> dict[str, str]:
    fields: dict[str, str] = {"last_event": "record rebuilt from object storage (Redis lost it)"}
    if manifest.latest is not None:
        fields.update(step=str(manifest.latest.step), epoch=str(manifest.latest.epoch + 1),  # status counts from 1
                      latest_checkpoint=manifest.latest.key)
    if manifest.best is not None:
        fields.update(best_checkpoint=manifest.best.key, best_value=repr(manifest.best.value))
    return fields


def recover_job(records: JobRecords, store: ObjectStore, publish: Publish, job_id: str) -> Recovered:
    """Rebuild one job's record from its spec.json and manifest.json; JobNotFound if the store has no spec."""
    if records.exists(job_id):
        return Recovered(job_id, "present", records.status(job_id).attempt)
    paths = JobPaths(job_id)
    try:
        spec = JobSpec.parse(json.loads(store.get_bytes(paths.spec)))
    except FileNotFoundError:
        raise JobNotFound(f"no job {job_id!r} in {store.url} (no {paths.spec})") from None
    except ValueError as exc:  # not JSON, or a spec this version of baton refuses (SpecError is not one)
        return Recovered(job_id, "skipped", 0, reason=f"{paths.spec} is unreadable: {exc}")
    except SpecError as exc:
        return Recovered(job_id, "skipped", 0, reason=f"{paths.spec} is not a valid spec here: {'; '.join(exc.problems)}")
    if store.exists(paths.run_lease) and not store.exists(paths.queued):
        return Recovered(job_id, "skipped", 0, reason="a `baton run` job (it holds no queue's record): "
                                                       f"run it again with baton run --id {job_id}")
    manifest = ManifestStore(store, paths).read()
    fields = {**spec_fields(spec, store.url), **_progress_fields(manifest)}
    step = manifest.latest.step if manifest.latest is not None else None
    if manifest.completed:
        if not records.restore(job_id, fields, JobState.succeeded, manifest.attempt):
            return Recovered(job_id, "present", records.status(job_id).attempt)
        return Recovered(job_id, "succeeded", manifest.attempt, step)
    claimed = manifest.attempt + ATTEMPTS_SKIPPED
    store.put_bytes(paths.queued, json.dumps({"queue": spec.resources.queue}).encode())  # a queue's job now
    if not records.restore(job_id, fields, JobState.retrying, claimed):
        return Recovered(job_id, "present", records.status(job_id).attempt)
    publish(job_id, claimed + 1)
    return Recovered(job_id, "queued", claimed + 1, step)


def recover_jobs(records: JobRecords, store: ObjectStore, publish: Publish,
                 job_ids: Optional[Iterable[str]] = None) -> list[Recovered]:
    """``recover_job`` for each of ``job_ids``, or for every job the store holds."""
    ids = stored_job_ids(store) if job_ids is None else list(job_ids)
    return [recover_job(records, store, publish, job_id) for job_id in ids]
