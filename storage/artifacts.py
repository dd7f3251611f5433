"""Reading a job's objects the only way readers may: through its committed ``manifest.json``.

Object keys carry the attempt that wrote them (storage/layout.py); which of them are the job's
metrics, best checkpoint or final artifacts is what the manifest says, never a well-known key.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from baton.schemas.errors import CheckpointCorrupt
from baton.schemas.manifest import CheckpointEntry, CheckpointManifest, ObjectRef

from baton.storage.stores.base import ObjectStore
from baton.storage.checkpoint_io import sha256_of

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
    if file_sha256(target) != ref.sha256:
        target.unlink()
        raise CheckpointCorrupt(f"{ref.key}: sha256 does not match the manifest")
    return target


def download_checkpoint(store: ObjectStore, entry: CheckpointEntry, target: Path) -> Path:
    """Fetch a checkpoint to ``target``: one file, or, for a sharded one, a directory holding its
    files under their own names (a torch.distributed.checkpoint directory). Every file is checked
    against its sha256; CheckpointCorrupt names the first that differs, FileNotFoundError one gone."""
    if entry.files is None:
        return download_verified(store, entry, target)
    target.mkdir(parents=True, exist_ok=True)
    for ref in entry.files:
        download_verified(store, ref, target / shard_name(entry, ref))
    return target


DOT_NAMES = {".metadata": "metadata"}
"""A sharded checkpoint's files whose names begin with a dot, and the names their objects get (a
key's parts may not begin with a dot: a file:// store keeps its own files under such names)."""


def object_name(name: str) -> str:
    """The object name of a sharded checkpoint's file ``name``."""
    return DOT_NAMES.get(name, name)


def shard_name(entry: CheckpointEntry, ref: ObjectRef) -> str:
    """A sharded checkpoint's file's name in its directory (its key less the checkpoint's prefix)."""
    name = ref.key.removeprefix(entry.key + "/")
    if not name or "/" in name or name.startswith(".") or name == ref.key:
        raise CheckpointCorrupt(f"{entry.key}: its listing names {ref.key}, which is not a file of the checkpoint")
    return {stored: original for original, stored in DOT_NAMES.items()}.get(name, name)


def file_sha256(path: Path, chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
