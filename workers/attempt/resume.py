"""Where an attempt resumes: a crashed training process's copy in memory when it is newer than the
durable checkpoint (``newer_in_memory``), else the newest committed checkpoint whose bytes verify.

A corrupt or missing latest (its bytes do not match the committed sha256, or it is gone) falls
back to the one before it (and says so). The entries after the one chosen are dropped from the
manifest and their objects deleted, so the manifest stays in step order and the next commit
cannot land behind a broken entry.

A checkpoint whose bytes verify but cannot be loaded here (CheckpointUnloadable: another torch,
out of memory) is not corrupt: the attempt fails with that error, nothing falls back and nothing
is deleted, so the job can resume from it in a sound environment.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from baton.schemas.errors import CheckpointCorrupt, TransientError
from baton.schemas.manifest import CheckpointEntry, CheckpointManifest, Reshard
from baton.storage.artifacts import download_checkpoint
from baton.storage.stores.base import ObjectStore
from baton.storage.checkpoint_io import load_bytes
from baton.storage.manifest_store import ManifestStore
from baton.storage.checkpoint_io import rows_of
from baton.storage.memory import memory_slots
from baton.storage.memory.memory_slots import InMemoryState
from baton.storage.stores.retry import retry_transient
from baton.storage.checkpoint_io import SHARDS_KEY

READ_RETRY_S = 120.0
"""How long reading a checkpoint is retried through transient storage errors."""


def load_latest_good(
    store: ObjectStore, manifest: CheckpointManifest, log: Callable[[str], None], scratch: Optional[Path] = None,
) -> tuple[Optional[dict[str, Any]], Optional[CheckpointEntry]]:
    """(state, entry) of the newest checkpoint that loads and verifies, or (None, None). A sharded
    checkpoint is downloaded whole into ``scratch`` (every file verified: one bad shard makes the
    whole checkpoint bad) and its state is rank 0's own file, with SHARDS_KEY naming the directory."""
    for entry in reversed(manifest.checkpoints):
        try:
            if entry.files is not None:
                return _download_sharded(store, entry, scratch, log), entry
            data = retry_transient(lambda: store.get_bytes(entry.key), READ_RETRY_S, f"read {entry.key}", log)
            return load_bytes(data, entry.sha256, where=entry.key), entry
        except FileNotFoundError:
            log(f"checkpoint {entry.key} is missing; falling back to the one before it")
        except CheckpointCorrupt as exc:
            log(f"{exc}; falling back to the one before it")
    return None, None


@dataclass(frozen=True)
class ResumePoint:
    """Where an attempt resumes: a durable checkpoint's step and position, or an in-memory copy's."""

    step: int
    epoch: int
    batch_in_epoch: int
    source: str = "checkpoint"  # or "memory"

    @classmethod
    def of(cls, entry: Optional[CheckpointEntry]) -> Optional["ResumePoint"]:
        return None if entry is None else cls(entry.step, entry.epoch, entry.batch_in_epoch)


@dataclass(frozen=True)
class Resume:
    """The state an attempt resumes from (None: the start), the durable checkpoint it continues (the
    one a copy in memory is newer than), and the point."""

    state: Optional[dict[str, Any]] = None
    entry: Optional[CheckpointEntry] = None
    point: Optional[ResumePoint] = None


def choose_resume(store: ObjectStore, manifest: CheckpointManifest, memory: Optional[Sequence[str]],
                  scratch: Path, log: Callable[[str], None]) -> Resume:
    """The copy in ``memory`` when it is newer than the durable checkpoint (which is then not read:
    only its step, to compare), else the newest good checkpoint; copies not taken are forgotten."""
    latest = manifest.checkpoints[-1] if manifest.checkpoints else None
    dirs = [Path(d) for d in memory] if memory else []
    copy = newer_in_memory(dirs, latest, log) if dirs else None
    if copy is not None:
        return Resume(copy.state, latest, ResumePoint(copy.step, copy.epoch, copy.batch_in_epoch, "memory"))
    if dirs:  # copies not taken belong to a run this attempt does not continue
        memory_slots.forget(dirs)
    state, entry = load_latest_good(store, manifest, log, scratch)
    return Resume(state, entry, ResumePoint.of(entry))


def newer_in_memory(dirs: list[Path], entry: Optional[CheckpointEntry],
                    log: Callable[[str], None]) -> Optional[InMemoryState]:
    """The in-memory copy a crashed training process left on this machine, when it is newer than the
    durable checkpoint ``entry`` and none of its validations lacks a durable checkpoint (a validation's
    checkpoint may hold the best weights: they must be in the store); else None, saying why."""
    copy = memory_slots.newest(dirs, log)
    if copy is None:
        return None
    durable = entry.step if entry is not None else 0
    if copy.step <= durable:
        log(f"the in-memory copy (step {copy.step}) is not newer than the durable checkpoint (step {durable}): "
            "resuming from the checkpoint")
        return None
    rows = rows_of(copy.state["metrics"])
    if rows and rows[-1]["step"] > durable:
        log(f"the in-memory copy (step {copy.step}) follows a validation at step {rows[-1]['step']} whose checkpoint "
            f"was not committed: resuming from the durable checkpoint (step {durable})")
        return None
    return copy


def _download_sharded(store: ObjectStore, entry: CheckpointEntry, scratch: Optional[Path],
                      log: Callable[[str], None]) -> dict[str, Any]:
    from baton.workers.parallel.sharded_state import read_own

    if scratch is None:
        raise ValueError(f"{entry.key} is a sharded checkpoint: resuming from it needs a scratch directory")
    directory = scratch / Path(entry.key).name
    shutil.rmtree(directory, ignore_errors=True)  # a previous candidate's files
    retry_transient(lambda: download_checkpoint(store, entry, directory), READ_RETRY_S, f"read {entry.key}", log)
    return {**read_own(directory, 0), SHARDS_KEY: str(directory)}


def pin_resume_point(manifests: ManifestStore, attempt: int, entry: Optional[CheckpointEntry],
                     log: Callable[[str], None], reshard: Optional[Reshard] = None) -> None:
    """Record where this attempt resumes from, and whether it reshards it; drop (and delete) the broken
    entries after it, and the record of reshards after it (that history is no longer the job's)."""
    dropped: list[CheckpointEntry] = []

    def mutate(manifest: CheckpointManifest) -> None:
        keep = manifest.checkpoints
        if entry is None:
            dropped[:], keep = keep, []
        else:
            index = next(i for i, e in enumerate(keep) if e.key == entry.key)
            dropped[:], keep = keep[index + 1:], keep[:index + 1]
        manifest.checkpoints = keep
        manifest.resumed_from = entry.step if entry is not None else None
        manifest.resumed_from_key = entry.key if entry is not None else None
        manifest.reshards = [r for r in manifest.reshards if entry is not None and r.step < entry.step]
        if reshard is not None:
            manifest.reshards.append(reshard)
        if manifest.best is not None and manifest.best.key in {bad.key for bad in dropped}:
            manifest.best = None  # it was the broken one; the resumed tracker names the next best

    manifests.update(attempt, mutate)
    for key in (key for bad in dropped for key in bad.object_keys()):
        try:
            manifests.store.delete(key)
        except TransientError as exc:
            log(f"could not delete unusable checkpoint {key}: {exc}")
