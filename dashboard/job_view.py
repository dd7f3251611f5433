"""One job as its page shows it: the status (from Redis, or made from the store alone when Redis holds
no record: a ``baton run`` job, or a Redis lost), the spec, the checkpoints, the artifacts that can be
downloaded, the report, and the timeline of its attempts."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from baton.schemas.errors import JobNotFound
from baton.schemas.manifest import CheckpointManifest, ObjectRef
from baton.schemas.status import JobStatus
from baton.storage.artifacts import final_files, read_verified
from baton.storage.layout import JobPaths
from baton.storage.records import events
from baton.storage.records.job_records import JobRecords
from baton.storage.stores.base import ObjectStore
from baton.dashboard.listing import store_fields
from baton.dashboard.timeline import timeline

ARTIFACTS = ("best", "final", "latest", "report", "curves")
"""What the page offers to download: the best weights (best.safetensors once finished, the best
checkpoint before), the last step's weights, the latest checkpoint, report.json, curves.png."""


@dataclass
class Found:
    job_id: str
    status: Optional[JobStatus]  # None: Redis holds no record
    spec: Optional[dict]
    store: ObjectStore
    manifest: Optional[CheckpointManifest]
    elsewhere: bool = False  # its record names a store other than the dashboard's: not read


def find(records: JobRecords, store: ObjectStore, default_url: str, job_id: str) -> Found:
    """The job from Redis and its store; JobNotFound when neither holds it. Only the dashboard's own store
    (``default_url``) is read: a job whose record names another (as its submitter chose) shows its record
    only, so a submitter cannot point the dashboard at a store or a directory of their choosing."""
    status: Optional[JobStatus] = None
    spec: Optional[dict] = None
    try:
        status = records.status(job_id)
        raw = records.raw(job_id).get("spec")
        spec = json.loads(raw) if raw else None
    except JobNotFound:
        pass
    paths = JobPaths(job_id)
    manifest = None
    elsewhere = status is not None and status.storage_url not in (None, default_url)
    try:
        manifest = None if elsewhere else CheckpointManifest.model_validate_json(store.get_bytes(paths.manifest))
    except (FileNotFoundError, ValueError):
        pass
    if spec is None and not elsewhere:
        try:
            spec = json.loads(store.get_bytes(paths.spec))
        except (FileNotFoundError, ValueError):
            if status is None:
                raise JobNotFound(f"no job {job_id!r} in Redis or in the store")
    return Found(job_id, status, spec, store, manifest, elsewhere)


def team_of(found: Found) -> tuple[str, str]:
    """The job's team and who submitted it ("": nobody the server proved): from its record, else its spec."""
    if found.status is not None:
        return found.status.team, found.status.submitted_by or ""
    resources = (found.spec or {}).get("resources") if isinstance(found.spec, dict) else None
    team = resources.get("team", "default") if isinstance(resources, dict) else "default"
    return str(team), ""


def stored_status(found: Found) -> dict[str, Any]:
    """A status made from the store alone (the fields it can tell; a spec is read as anyone may have written it)."""
    manifest = found.manifest
    latest = manifest.latest if manifest is not None else None
    status = store_fields(found.spec if isinstance(found.spec, dict) else {}, manifest)
    status.update(id=found.job_id, attempt=manifest.attempt if manifest is not None else 0,
                  latest_checkpoint=latest.key if latest is not None else None,
                  best_checkpoint=manifest.best.key if manifest is not None and manifest.best is not None else None)
    return status


def checkpoints(manifest: Optional[CheckpointManifest]) -> list[dict[str, Any]]:
    if manifest is None:
        return []
    best_key = manifest.best.key if manifest.best is not None else None
    rows: list[dict[str, Any]] = [{"step": c.step, "epoch": c.epoch, "kind": c.kind, "attempt": c.attempt, "size": c.size,
             "created_at": c.created_at, "key": c.key, "latest": c is manifest.latest, "best": False}
            for c in manifest.checkpoints]
    if manifest.best is not None:
        b = manifest.best
        same = next((row for row in rows if row["step"] == b.step), None)
        if same is None:  # (its own object, kept out of rotation: the rotated one may be gone)
            same = {"step": b.step, "epoch": b.epoch, "kind": b.kind, "attempt": b.attempt, "size": b.size,
                    "created_at": b.created_at, "key": best_key, "latest": False}
            rows.append(same)
        same.update(best=True, metric=b.metric, value=b.value)
    return sorted(rows, key=lambda row: row["step"])


def artifact(manifest: Optional[CheckpointManifest], which: str) -> tuple[ObjectRef, str]:
    """The object ``which`` names and the file name it downloads as; FileNotFoundError when there is none."""
    if which not in ARTIFACTS:
        raise FileNotFoundError(f"no artifact {which!r}: one of {', '.join(ARTIFACTS)}")
    if manifest is None:
        raise FileNotFoundError("the job has no manifest yet")
    if manifest.completed and manifest.final is not None:
        files = final_files(manifest)
        named = {"best": "best.safetensors", "final": "model.safetensors", "report": "report.json",
                 "curves": "curves.png"}.get(which)
        if named is not None and named in files:
            return files[named], f"{manifest.job_id}-{named}"
    entry = manifest.best if which == "best" else manifest.latest if which == "latest" else None
    if entry is None or entry.files is not None:
        raise FileNotFoundError(f"no {which} artifact (yet)" if entry is None else
                                f"the {which} checkpoint is sharded: fetch it with baton fetch")
    return entry, f"{manifest.job_id}-{which}-step{entry.step}{Path(entry.key).suffix}"


def available(manifest: Optional[CheckpointManifest]) -> list[dict[str, Any]]:
    found = []
    for which in ARTIFACTS:
        try:
            ref, name = artifact(manifest, which)
        except FileNotFoundError:
            continue
        found.append({"which": which, "file": name, "size": ref.size})
    return found


def report(found: Found) -> Optional[dict]:
    manifest = found.manifest
    if manifest is None or not manifest.completed:
        return None
    try:
        return json.loads(read_verified(found.store, final_files(manifest)["report.json"]))
    except (FileNotFoundError, KeyError, ValueError):
        return None


def detail(records: JobRecords, found: Found) -> dict[str, Any]:
    status = found.status.model_dump(mode="json") if found.status is not None else stored_status(found)
    return {"status": status, "source": "redis" if found.status is not None else "store", "spec": found.spec,
            "store_note": (f"its store ({found.status.storage_url if found.status else ''}) is not this "
                           "dashboard's (BATON_STORAGE_URL): its checkpoints, curves and log are not shown")
            if found.elsewhere else None,
            "checkpoints": checkpoints(found.manifest), "artifacts": available(found.manifest),
            "report": report(found), "timeline": timeline(events.events(records.redis, found.job_id)),
            "resumed_from": found.manifest.resumed_from if found.manifest is not None else None}
