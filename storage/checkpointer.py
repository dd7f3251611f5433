"""The asynchronous checkpointer: the loop waits only for the host snapshot.

Serialization, sha256, upload, verification and the manifest commit run on one background
thread, which can run at a lower scheduling priority than training (``priority.py``, opt-in). At most one checkpoint is in flight. The policy when the next one is due while the
previous is still in flight:

- a periodic (``every_steps``) checkpoint is *skipped* and counted: training goes on, and the
  next periodic checkpoint is taken when due;
- a mandatory checkpoint (epoch end, preemption, cancel) *waits* for the one in flight.

A checkpoint becomes visible (listed in the manifest) only after its object is uploaded and its
size verified; rotation deletes objects only after the manifest that drops them is committed.

Everything is written under this attempt's own keys (``attempt-<n>/``: the checkpoint, the
metrics rows it carries) *before* the fenced manifest compare-and-swap that refers to them, so an
attempt that was fenced out cannot overwrite anything a reader can reach: its objects are never
referenced, and a later commit's garbage collection deletes them. The best checkpoint is the
manifest's ``best`` entry, not a copy. ``abandon`` cancels the checkpoint in flight instead of
finishing it: nothing is committed once it has returned.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Optional

from schemas.errors import CheckpointCancelled, TransientError
from schemas.manifest import BestEntry, CheckpointEntry, CheckpointManifest, MetricsRef

from .base import ObjectStore
from .checkpoint_io import save_to_file, sha256_of
from .layout import JobPaths
from .manifest_store import ManifestStore
from .priority import background_nice as nice_setting, lower_this_thread
from .retry import retry_transient
from .rotation import collect_garbage, rotate
from .snapshot import Copies, HostSnapshot

UPLOAD_RETRY_S = 600.0
"""How long one checkpoint's upload and commit are retried through transient storage errors."""


@dataclass(frozen=True)
class CheckpointRequest:
    step: int
    epoch: int
    batch_in_epoch: int
    kind: str  # "step" | "epoch" | "stop"
    best: Optional[tuple[str, float]] = None  # (metric, value) when this checkpoint is the new best
    metrics_rows: Optional[list[dict]] = None  # every row so far: written with the checkpoint, referenced by its commit


@dataclass
class CheckpointStats:
    key: str
    kind: str
    stall_s: float
    write_s: float = 0.0
    bytes: int = 0


@dataclass
class _InFlight:
    future: Future
    stats: CheckpointStats


@dataclass
class CheckpointerTotals:
    taken: int = 0
    skipped: int = 0
    done: list[CheckpointStats] = field(default_factory=list)


class AsyncCheckpointer:
    def __init__(
        self,
        store: ObjectStore,
        paths: JobPaths,
        attempt: int,
        keep_last: int,
        *,
        fence: Callable[[], None] = lambda: None,
        on_commit: Callable[[CheckpointManifest, CheckpointStats], None] = lambda manifest, stats: None,
        pin_memory: bool = False,
        upload_retry_s: float = UPLOAD_RETRY_S,
        log: Callable[[str], None] = print,
        background_nice: Optional[int] = None,  # None: BATON_BACKGROUND_NICE (priority.py)
    ):
        nice = background_nice if background_nice is not None else nice_setting()  # a bad setting fails here
        self.store = store
        self.paths = paths.for_attempt(attempt)
        self.attempt = attempt
        self.keep_last = keep_last
        self.fence = fence
        self.on_commit = on_commit
        self.upload_retry_s = upload_retry_s
        self.log = log
        self.manifests = ManifestStore(store, paths)
        self.totals = CheckpointerTotals()
        self._snapshot = HostSnapshot(pin_memory=pin_memory)
        self._spool = Path(tempfile.mkdtemp(prefix="baton-spool-", dir=store.scratch_dir()))
        # the thread serializes, hashes and uploads, niced when BATON_BACKGROUND_NICE says so (priority.py)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="baton-checkpoint",
                                        initializer=lower_this_thread, initargs=(nice,))
        self._inflight: Optional[_InFlight] = None
        self._cancelled = threading.Event()
        self._commit_lock = threading.Lock()  # held while a manifest write may be under way

    # --- called by the training loop -------------------------------------------------------
    def save(self, capture: Callable[[], dict[str, Any]], request: CheckpointRequest, mandatory: bool,
             stable: Optional[Collection[int]] = None) -> bool:
        """Snapshot the state ``capture()`` returns and commit it in the background; False when
        skipped (see the policy above). The stall is all the loop waits here: for a checkpoint
        still in flight (mandatory ones only), the capture and the snapshot.

        ``stable``: storage keys of the tensors only ``optimizer.step`` modifies; on CUDA their
        device-to-host copy then overlaps the next forward/backward, and the loop must call
        ``before_optimizer_step()`` (snapshot.py)."""
        if self._inflight is not None and not self._inflight.future.done():
            if not mandatory:
                self.totals.skipped += 1
                return False
        started = time.perf_counter()  # a wait for the checkpoint in flight blocks the loop too
        self.wait()
        snapshot = self._snapshot.take(capture(), stable)
        stats = CheckpointStats(self.paths.checkpoint(request.step), request.kind, time.perf_counter() - started)
        self.totals.taken += 1
        future = self._pool.submit(self._write_and_commit, snapshot, self._snapshot.copies, request, stats)
        self._inflight = _InFlight(future, stats)
        return True

    def before_optimizer_step(self) -> None:
        """Called by the loop before it modifies the parameters or the optimizer state: waits for a
        snapshot's device-to-host copy still running on a side stream (CUDA; a no-op otherwise).
        The time waited is part of that checkpoint's stall."""
        waited = self._snapshot.wait_for_side_copies()
        if waited and self._inflight is not None:
            self._inflight.stats.stall_s += waited

    def poll(self) -> None:
        """Collect the checkpoint in flight if it has finished (re-raising its failure)."""
        if self._inflight is not None and self._inflight.future.done():
            self.wait()

    def wait(self) -> None:
        """Block until the checkpoint in flight is committed; re-raise its failure."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.future.result()
            self.totals.done.append(inflight.stats)

    def close(self) -> None:
        """Finish the checkpoint in flight (raising its error), then release the thread and spool."""
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
            shutil.rmtree(self._spool, ignore_errors=True)

    def abandon(self) -> None:
        """Shut down after a failure elsewhere (fenced out, the job's code failed, storage gone):
        cancel the checkpoint in flight rather than wait for its upload (up to UPLOAD_RETRY_S).

        Returns at once, except while a manifest write is under way (one request): from then on
        nothing of this checkpointer is committed. An upload still running finishes in the
        background as an unreferenced object, which a later commit garbage-collects. Errors of the
        checkpoint in flight are logged, not raised, so the original failure is the one reported."""
        self._cancelled.set()
        with self._commit_lock:
            pass  # a commit that passed its cancellation check has landed (or failed) now
        inflight, self._inflight = self._inflight, None
        if inflight is not None and inflight.future.done() and inflight.future.exception() is not None:
            exc = inflight.future.exception()
            self.log(f"checkpoint in flight failed while stopping: {type(exc).__name__}: {exc}")
        self._pool.shutdown(wait=False, cancel_futures=True)
        if inflight is None or inflight.future.done():
            shutil.rmtree(self._spool, ignore_errors=True)
        else:
            inflight.future.add_done_callback(lambda _: shutil.rmtree(self._spool, ignore_errors=True))

    # --- the background thread -------------------------------------------------------------
    def _retry(self, fn: Callable[[], Any], what: str) -> Any:
        def unless_cancelled() -> Any:
            self._check_cancelled()
            return fn()
        return retry_transient(unless_cancelled, self.upload_retry_s, what, self.log)

    def _check_cancelled(self) -> None:
        if self._cancelled.is_set():
            raise CheckpointCancelled("the checkpoint was cancelled: its attempt is over")

    def _write_and_commit(self, snapshot: Any, copies: Copies, request: CheckpointRequest,
                          stats: CheckpointStats) -> None:
        started = time.perf_counter()
        tmp = self._spool / f"step-{request.step}.pt"
        try:
            copies.wait_all()  # CUDA copies still landing in the host buffers (none on the CPU)
            size, sha256 = save_to_file(snapshot, tmp)
            del snapshot  # the buffers may be reused from here on
            self._retry(lambda: self._upload_verified(stats.key, tmp, size), f"upload {stats.key}")
        finally:
            tmp.unlink(missing_ok=True)
        metrics = self._write_metrics(request) if request.metrics_rows is not None else None
        entry = CheckpointEntry(
            key=stats.key, step=request.step, epoch=request.epoch, batch_in_epoch=request.batch_in_epoch,
            kind=request.kind, attempt=self.attempt, size=size, sha256=sha256, created_at=time.time(),
        )
        manifest, dropped = self._commit(entry, request, metrics)
        self._delete(dropped)
        collect_garbage(self.store, self.paths, manifest, self.attempt, self.log)
        stats.write_s = time.perf_counter() - started
        stats.bytes = size
        self.on_commit(manifest, stats)

    def _write_metrics(self, request: CheckpointRequest) -> MetricsRef:
        """The rows as of this checkpoint, under this attempt's key (referenced by its commit)."""
        key = self.paths.metrics(request.step)
        body = "".join(json.dumps(row) + "\n" for row in request.metrics_rows).encode()
        self._retry(lambda: self.store.put_bytes(key, body), f"write {key}")
        return MetricsRef(key=key, size=len(body), sha256=sha256_of(body), step=request.step, attempt=self.attempt)

    def _commit(self, entry: CheckpointEntry, request: CheckpointRequest,
                metrics: Optional[MetricsRef]) -> tuple[CheckpointManifest, list[CheckpointEntry]]:
        """The fenced compare-and-swap that makes the checkpoint (and its metrics, and best) visible."""
        dropped: list[CheckpointEntry] = []

        def commit(manifest: CheckpointManifest) -> None:
            self._check_cancelled()
            manifest.checkpoints = [e for e in manifest.checkpoints if e.key != entry.key] + [entry]
            if request.best is not None:
                metric, value = request.best
                manifest.best = BestEntry(**entry.model_dump(), metric=metric, value=value)
            if metrics is not None:
                manifest.metrics = metrics
            dropped[:] = rotate(manifest, self.keep_last)

        with self._commit_lock:
            self._check_cancelled()
            self.fence()
            manifest = self._retry(lambda: self.manifests.update(self.attempt, commit), "commit manifest")
        return manifest, dropped

    def _upload_verified(self, key: str, path: Path, size: int) -> None:
        self.store.put_file(key, path, consume=True)
        stored = self.store.size(key)
        if stored != size:
            raise TransientError(f"{key}: stored {stored} bytes, wrote {size}")

    def _delete(self, entries: list[CheckpointEntry]) -> None:
        for entry in entries:
            try:  # after the commit: done even if cancelled meanwhile
                retry_transient(lambda: self.store.delete(entry.key), self.upload_retry_s, f"delete {entry.key}", self.log)
            except TransientError as exc:  # a leftover object costs space, not correctness
                self.log(f"rotation: could not delete {entry.key}: {exc}")
