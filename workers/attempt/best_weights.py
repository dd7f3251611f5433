"""Which weights ``best.safetensors`` holds: the best checkpoint's, or, when its object is corrupt or
gone, those of the best committed checkpoint that verifies.

A job's training is over when this runs: a best checkpoint that cannot be read must not fail it
(every later attempt would resume from the final checkpoint and fail the same way). The other
candidates are the committed checkpoints taken at a validation's step (the weights that validation
scored), ranked by the monitored value that validation recorded. When none verifies, the job
finishes without best weights. Either way ``note`` says what happened, for the report.

A checkpoint whose bytes verify but cannot be loaded here (CheckpointUnloadable) is not skipped:
the environment is wrong, not the checkpoint, as on resume.
"""
from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from typing import Any, Callable, Optional

from baton.schemas.errors import CheckpointCorrupt
from baton.schemas.manifest import CheckpointEntry, CheckpointManifest
from baton.storage.stores.base import ObjectStore
from baton.storage import owned_dirs
from baton.storage.artifacts import download_checkpoint
from baton.storage.checkpoint_io import load_bytes
from baton.storage.checkpointing.checkpointer import SPOOL_PREFIX
from baton.storage.stores.retry import retry_transient

READ_RETRY_S = 120.0
"""How long reading a checkpoint is retried through transient storage errors."""


@dataclass
class BestWeights:
    model: Optional[dict[str, Any]]  # the chosen checkpoint's model state_dict; None: no best weights
    entry: Optional[CheckpointEntry]  # the checkpoint it came from
    note: Optional[str] = None  # why these are not the best checkpoint's own weights


def candidates(manifest: CheckpointManifest, rows: list[dict], mode: str) -> list[tuple[CheckpointEntry, float]]:
    """The best checkpoint first, then every other committed checkpoint whose step had a validation
    with a finite monitored value, best value first (the earlier step on a tie, as the tracker picks)."""
    best = manifest.best
    if best is None:
        return []
    value_at = {row["step"]: row.get(best.metric) for row in rows}
    others = {}
    for entry in manifest.checkpoints:
        value = value_at.get(entry.step)
        if entry.key != best.key and isinstance(value, (int, float)) and math.isfinite(value):
            others[entry.key] = (entry, float(value))
    sign = 1.0 if mode == "min" else -1.0
    return [(best, best.value)] + sorted(others.values(), key=lambda c: (sign * c[1], c[0].step))


def choose_best_weights(store: ObjectStore, manifest: CheckpointManifest, rows: list[dict], mode: str,
                        log: Callable[[str], None]) -> BestWeights:
    """The model state of the first candidate (``candidates``) whose object exists and verifies."""
    ranked = candidates(manifest, rows, mode)
    if not ranked:
        return BestWeights(None, None)
    metric = manifest.best.metric if manifest.best is not None else "the monitored metric"
    failed: list[str] = []
    for entry, value in ranked:
        try:
            model = read_model(store, entry, log)
        except FileNotFoundError:
            failed.append(f"{entry.key} is missing")
            continue
        except CheckpointCorrupt as exc:
            failed.append(f"{entry.key} failed verification ({_reason(exc, entry.key)})")
            continue
        if not failed:
            return BestWeights(model, entry)
        note = (f"best checkpoint {'; '.join(failed)}; best.safetensors holds {entry.key} (step {entry.step}, "
                f"{metric} = {value:.6g}), the best checkpoint that verifies")
        log(note)
        return BestWeights(model, entry, note)
    note = (f"best checkpoint {'; '.join(failed)}; no committed checkpoint with a known {metric} "
            "verifies, so there is no best.safetensors")
    log(note)
    return BestWeights(None, None, note)


def read_model(store: ObjectStore, entry: CheckpointEntry, log: Callable[[str], None]) -> dict[str, Any]:
    """A committed checkpoint's model state_dict, verified; a sharded one's assembled whole from its
    shards (every key, full tensors). FileNotFoundError: an object is gone; CheckpointCorrupt."""
    if entry.files is None:
        data = retry_transient(lambda: store.get_bytes(entry.key), READ_RETRY_S, f"read {entry.key}", log)
        return load_bytes(data, entry.sha256, where=entry.key)["model"]
    directory = owned_dirs.make(SPOOL_PREFIX, store.scratch_dir())
    try:
        retry_transient(lambda: download_checkpoint(store, entry, directory / "checkpoint"), READ_RETRY_S,
                        f"read {entry.key}", log)
        from baton.workers.parallel.sharded_state import consolidated_model  # (torch's DCP: a sharded job's alone)

        return consolidated_model(directory / "checkpoint")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _reason(exc: CheckpointCorrupt, key: str) -> str:
    """The error's own words, without the key the note names already."""
    return str(exc).removeprefix(f"{key}: ")
