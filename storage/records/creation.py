"""Creating a job: its queue mark and spec.json in the store, then its record (marked for publishing).

The client's submit and sweep create jobs this way, and so does whoever samples a search's next trials
(the client, or a worker whose trial paused)."""
from __future__ import annotations

import json

from baton.schemas.errors import PreconditionFailed, SpecError
from baton.schemas.spec import JobSpec
from baton.storage.layout import JobPaths
from baton.storage.stores.base import ObjectStore

from baton.storage.records.job_records import JobRecords, spec_fields


def create_job(records: JobRecords, store: ObjectStore, job_id: str, parsed: JobSpec, extra: dict[str, str]) -> None:
    """Store spec.json and a queued record (marked for publishing). spec.json is a conditional
    create: of two clients racing on one id, the one whose spec is stored is the one that goes on."""
    paths = JobPaths(job_id)
    try:  # the queue's mark first: a `baton run` of this id from now on refuses (it checks again once it holds the job)
        store.put_if(paths.queued, json.dumps({"queue": parsed.resources.queue}).encode(), None)
    except PreconditionFailed:
        raise SpecError([f"id: a job {job_id!r} already exists"]) from None
    try:
        store.put_if(paths.spec, parsed.model_dump_json(indent=2).encode(), None)
    except PreconditionFailed:  # a `baton run` of this id stored its spec first: the job is its
        store.delete(paths.queued)
        raise SpecError([f"id: a job {job_id!r} already exists"]) from None
    if not records.create(job_id, {**spec_fields(parsed, store.url), **extra}):
        raise SpecError([f"id: a job {job_id!r} already exists"])
