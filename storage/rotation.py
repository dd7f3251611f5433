"""keep_last rotation: which committed checkpoints leave the manifest."""
from __future__ import annotations

from schemas.manifest import CheckpointEntry, CheckpointManifest


def rotate(manifest: CheckpointManifest, keep_last: int) -> list[CheckpointEntry]:
    """Drop all but the newest ``keep_last`` checkpoints from ``manifest`` and return the dropped.

    The checkpoint the current attempt resumed from stays until the attempt ends (it is its
    fallback), and so does every newer one; best.pt is a separate object and never rotated.
    """
    keep = manifest.checkpoints[-keep_last:]
    dropped = []
    for entry in manifest.checkpoints[:-keep_last]:
        if entry.step == manifest.resumed_from:
            keep.insert(0, entry)
        else:
            dropped.append(entry)
    manifest.checkpoints = keep
    return dropped
