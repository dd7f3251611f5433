"""keep_last rotation (which committed checkpoints leave the manifest) and garbage collection
(which attempt-keyed objects no manifest will ever refer to again)."""
from __future__ import annotations

from typing import Callable

from baton.schemas.errors import TransientError
from baton.schemas.manifest import CheckpointEntry, CheckpointManifest

from baton.storage.stores.base import ObjectStore
from baton.storage.layout import JobPaths, attempt_of, is_side_output


def rotate(manifest: CheckpointManifest, keep_last: int) -> list[CheckpointEntry]:
    """Drop all but the newest ``keep_last`` checkpoints from ``manifest``; return those whose
    objects may be deleted. The checkpoint the current attempt resumed from stays listed until the
    attempt ends (it is its fallback); the best checkpoint may leave the list but its object is
    still referenced (``manifest.best``), so it is never among those returned."""
    keep = manifest.checkpoints[-keep_last:]
    dropped = []
    for entry in manifest.checkpoints[:-keep_last]:
        if entry.key == manifest.resumed_from_key or (manifest.resumed_from_key is None and entry.step == manifest.resumed_from):
            keep.insert(0, entry)
        else:
            dropped.append(entry)
    manifest.checkpoints = keep
    referenced = manifest.referenced_keys()
    return [entry for entry in dropped if referenced.isdisjoint(entry.object_keys())]


def collect_garbage(store: ObjectStore, paths: JobPaths, manifest: CheckpointManifest, attempt: int,
                    log: Callable[[str], None]) -> list[str]:
    """Delete the attempt-keyed objects of ``attempt`` and older ones that ``manifest`` (just
    committed by ``attempt``) does not refer to: uploads of fenced-out attempts, replaced metrics.
    Side outputs (``layout.is_side_output``: TensorBoard event files) are kept.

    Safe because a later manifest can only refer to objects this one refers to, or to objects of a
    newer attempt (never touched here); and this attempt writes from one thread, so none of its
    own objects is waiting for its commit while this runs. Returns the deleted keys."""
    referenced = manifest.referenced_keys()
    deleted = []
    for key in store.list(paths.attempts):
        owner = attempt_of(key)
        if owner is None or owner > attempt or key in referenced or is_side_output(key):
            continue  # side outputs (TensorBoard) are listed by their readers, never referenced
        try:
            store.delete(key)
            deleted.append(key)
        except TransientError as exc:  # a leftover object costs space, not correctness; the next pass retries
            log(f"garbage collection: could not delete {key}: {exc}")
    return deleted
