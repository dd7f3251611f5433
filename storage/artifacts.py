"""Reading a job's objects the only way readers may: through its committed ``manifest.json``.

Object keys carry the attempt that wrote them (storage/layout.py); which of them are the job's
metrics, best checkpoint or final artifacts is what the manifest says, never a well-known key.
"""
from __future__ import annotations

import json
from pathlib import Path

from baton.schemas.errors import CheckpointCorrupt
from baton.schemas.manifest import CheckpointManifest, ObjectRef

from .base import ObjectStore
from .checkpoint_io import sha256_of

METRICS_FILE = "metrics.jsonl"
"""The name the committed metrics rows get when fetched (``baton fetch --which final``)."""


def read_verified(store: ObjectStore, ref: ObjectRef) -> bytes:
    data = store.get_bytes(ref.key)
    if sha256_of(data) != ref.sha256:
        raise CheckpointCorrupt(f"{ref.key}: sha256 does not match the manifest")
    return data


def read_metrics(store: ObjectStore, manifest: CheckpointManifest) -> list[dict]:
    """The metrics rows of the latest committed checkpoint that carried them ([] before the first)."""
    if manifest.metrics is None:
        return []
    return [json.loads(line) for line in read_verified(store, manifest.metrics).decode().splitlines() if line]


def final_files(manifest: CheckpointManifest) -> dict[str, ObjectRef]:
    """File name -> object of the finished job's artifacts; FileNotFoundError before it finished."""
    if not manifest.completed or manifest.final is None:
        raise FileNotFoundError(f"job {manifest.job_id} has not finished: no final artifacts yet (try which='latest')")
    final = manifest.final
    refs = (final.model, final.best_model, final.report, final.curves)
    files = {Path(ref.key).name: ref for ref in refs if ref is not None}
    if manifest.metrics is not None:
        files[METRICS_FILE] = manifest.metrics
    return files


def download_verified(store: ObjectStore, ref: ObjectRef, target: Path) -> Path:
    """Fetch ``ref`` to ``target``, checked against the manifest's sha256 (removed if it differs)."""
    store.get_file(ref.key, target)
    if sha256_of(target.read_bytes()) != ref.sha256:
        target.unlink()
        raise CheckpointCorrupt(f"{ref.key}: sha256 does not match the manifest")
    return target
