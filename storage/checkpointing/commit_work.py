"""A checkpoint's storage half: serialize and hash in one pass, upload, verify the size, write the
metrics rows, the fenced manifest commit, rotation and garbage collection.

It runs in the checkpointer's writer: a thread of the training process, or the writer process
(``writer_process.py``), which gives it a core and an interpreter of its own. The only step that
needs the training process is the fence just before the manifest's compare-and-swap: ``gate``
runs the swap after it (in a thread: under the checkpointer's commit lock; in the writer process:
after the training process answered "go"). ``cancelled`` says when the attempt is over: checked
before every storage call (and every retry of one), it stops the work uncommitted.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from baton.schemas.errors import CheckpointCancelled, CheckpointWriteFailed, TransientError
from baton.schemas.manifest import BestEntry, CheckpointEntry, CheckpointManifest, MetricsRef

from baton.storage.checkpointing.contract import CheckpointRequest, CheckpointTarget
from baton.storage.checkpoint_io import ROWS_KEY, RowLines, save_to_file, sha256_of
from baton.storage.manifest_store import ManifestStore
from baton.storage.stores.retry import retry_transient
from baton.storage.rotation import collect_garbage, rotate
from baton.storage.checkpointing.plain import unwrap

T = TypeVar("T")


@dataclass(frozen=True)
class Committed:
    """What a finished commit reports back to the training process."""

    manifest: CheckpointManifest
    size: int
    write_s: float  # from the start of serialization to the end of garbage collection


class CommitWork:
    """``target``'s commits (its fence is ``gate``'s to run); ``spool`` holds a checkpoint's file while it
    uploads; ``cancelled()`` says when the attempt is over."""

    def __init__(self, target: CheckpointTarget, spool: Path, gate: Callable[[Callable[[], Any]], Any],
                 cancelled: Callable[[], bool]):
        self.store = target.store
        self.paths = target.attempt_paths
        self.attempt = target.attempt
        self.keep_last = target.keep_last
        self.spool = spool
        self.upload_retry_s = target.upload_retry_s
        self.log = target.log
        self.gate = gate
        self.cancelled = cancelled
        self.manifests = ManifestStore(target.store, target.paths)
        self._lines = RowLines()

    def run(self, snapshot: dict[str, Any], request: CheckpointRequest, key: str) -> Committed:
        """Write, upload and commit one checkpoint. Nothing here runs the job's code: an OSError (a
        full disk under a file:// store's objects or the spool) is this machine's, CheckpointWriteFailed."""
        try:
            return self._run(snapshot, request, key)
        except OSError as exc:
            raise CheckpointWriteFailed(f"could not write checkpoint {key}: {type(exc).__name__}: {exc}") from exc

    def _run(self, snapshot: dict[str, Any], request: CheckpointRequest, key: str) -> Committed:
        started = time.perf_counter()
        tmp = self.spool / f"step-{request.step}.pt"
        state = unwrap(snapshot)
        del snapshot
        if isinstance(state.get(ROWS_KEY), list):
            state[ROWS_KEY] = self._lines.encode(state[ROWS_KEY])  # stored as JSON lines (checkpoint_io)
        try:
            size, sha256 = save_to_file(state, tmp)
            del state  # the buffers may be reused from here on
            self._retry(lambda: self._upload_verified(key, tmp, size), f"upload {key}")
        finally:
            tmp.unlink(missing_ok=True)
        entry = CheckpointEntry(
            key=key, step=request.step, epoch=request.epoch, batch_in_epoch=request.batch_in_epoch,
            kind=request.kind, attempt=self.attempt, size=size, sha256=sha256, created_at=time.time(),
        )
        return Committed(self.publish(entry, request), size, time.perf_counter() - started)

    def publish(self, entry: CheckpointEntry, request: CheckpointRequest) -> CheckpointManifest:
        """Make an uploaded checkpoint visible: its metrics rows, the fenced commit, rotation and
        garbage collection (a sharded checkpoint's holder calls this once every rank's shard is up)."""
        metrics = self._write_metrics(request) if request.metrics_rows is not None else None
        manifest, dropped = self._commit(entry, request, metrics)
        self._delete(dropped)
        collect_garbage(self.store, self.paths, manifest, self.attempt, self.log)
        return manifest

    def check_cancelled(self) -> None:
        if self.cancelled():
            raise CheckpointCancelled("the checkpoint was cancelled: its attempt is over")

    def _retry(self, fn: Callable[[], Any], what: str) -> Any:
        def unless_cancelled() -> Any:
            self.check_cancelled()
            return fn()
        return retry_transient(unless_cancelled, self.upload_retry_s, what, self.log)

    def _write_metrics(self, request: CheckpointRequest) -> MetricsRef:
        """The rows as of this checkpoint, under this attempt's key (referenced by its commit)."""
        key = self.paths.metrics(request.step)
        body = self._lines.encode(request.metrics_rows or []).encode()  # each row was encoded once, for its checkpoint
        self._retry(lambda: self.store.put_bytes(key, body), f"write {key}")
        return MetricsRef(key=key, size=len(body), sha256=sha256_of(body), step=request.step, attempt=self.attempt)

    def _commit(self, entry: CheckpointEntry, request: CheckpointRequest,
                metrics: Optional[MetricsRef]) -> tuple[CheckpointManifest, list[CheckpointEntry]]:
        """The fenced compare-and-swap that makes the checkpoint (and its metrics, and best) visible."""
        dropped: list[CheckpointEntry] = []

        def commit(manifest: CheckpointManifest) -> None:
            self.check_cancelled()
            manifest.checkpoints = [e for e in manifest.checkpoints if e.key != entry.key] + [entry]
            if request.best is not None:
                metric, value = request.best
                manifest.best = BestEntry(**entry.model_dump(), metric=metric, value=value)
            if metrics is not None:
                manifest.metrics = metrics
            dropped[:] = rotate(manifest, self.keep_last)

        manifest: CheckpointManifest = self.gate(
            lambda: self._retry(lambda: self.manifests.update(self.attempt, commit), "commit manifest"))
        return manifest, dropped

    def _upload_verified(self, key: str, path: Path, size: int) -> None:
        self.store.put_file(key, path, consume=True)
        stored = self.store.size(key)
        if stored != size:
            raise TransientError(f"{key}: stored {stored} bytes, wrote {size}")

    def _delete(self, entries: list[CheckpointEntry]) -> None:
        for entry in entries:
            for key in entry.object_keys():
                try:  # after the commit: done even if cancelled meanwhile
                    retry_transient(lambda: self.store.delete(key), self.upload_retry_s, f"delete {key}", self.log)
                except TransientError as exc:  # a leftover object costs space, not correctness
                    self.log(f"rotation: could not delete {key}: {exc}")
