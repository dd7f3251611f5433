"""The asynchronous checkpointer: the loop waits only for the host snapshot.

Serialization, sha256, upload, verification and the manifest commit (``commit_work.py``) run in
the *writer*: by default a process of its own (``writer_process.py``), reading the snapshot from
buffer files both processes map, so the commit's Python work never holds the training loop's GIL.
A thread of the training process writes instead while that process is starting, where the
snapshot cannot be shared (CUDA's pinned buffers), where the store object cannot be reopened by
its URL in another process (a test's wrapped store), or with ``BATON_CHECKPOINT_WRITER=thread``.
Either can run at a lower scheduling priority than training (``priority.py``, opt-in). At most
one checkpoint is in flight. The policy when the next one is due while the previous is still in flight:

- a periodic (``every_steps``) checkpoint is *skipped* and counted: training goes on, and the
  next periodic checkpoint is taken when due (one due within ``checkpoint.min_interval_s`` of the
  last one taken is skipped likewise: ``contract.Spacing``);
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

import os
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Collection, Optional


from baton.storage import failpoints
from baton.storage.stores.base import ObjectStore
from baton.storage.checkpointing.commit_work import Committed, CommitWork
from baton.storage.checkpointing.contract import (CheckpointerTotals, CheckpointRequest, CheckpointStats, CheckpointTarget,
                                                  Spacing)
from baton.storage import owned_dirs
from baton.storage.checkpointing import writer_start
from baton.storage.checkpointing.priority import background_nice as nice_setting, lower_this_thread
from baton.storage.checkpointing.shared_buffers import SharedBuffers
from baton.storage.checkpointing.snapshot import Copies, HostSnapshot

SPOOL_PREFIX = owned_dirs.SPOOL_PREFIX
"""The spool directories' names (``owned_dirs.py``: those of a process killed outright are removed
by the next worker or ``baton run`` started on the machine)."""
WRITER_ENV = writer_start.WRITER_ENV


def writer_kind(store: ObjectStore, pin_memory: bool, setting: Optional[str] = None) -> str:
    """``process`` or ``thread`` for this store and device (see the module's docstring)."""
    value = (setting if setting is not None else os.environ.get(WRITER_ENV, "process")).strip() or "process"
    if value not in ("process", "thread"):
        raise ValueError(f"{WRITER_ENV}={value!r}: expected process or thread")
    if value == "thread" or pin_memory or store.reopen_url() is None:
        return "thread"
    return "process"


@dataclass
class _InFlight:
    future: Future
    stats: CheckpointStats


class AsyncCheckpointer:
    """A single process's checkpointer (the ``Checkpointer`` protocol): ``target``'s checkpoints, written
    by a process or a thread (``writer``: None reads BATON_CHECKPOINT_WRITER), its snapshot buffers
    pinned where ``pin_memory`` (CUDA), at ``background_nice`` (None: BATON_BACKGROUND_NICE)."""

    captures_weights = True

    def __init__(self, target: CheckpointTarget, *, pin_memory: bool = False, background_nice: Optional[int] = None,
                 writer: Optional[str] = None):
        nice = background_nice if background_nice is not None else nice_setting()  # a bad setting fails here
        store = target.store
        self.writer = writer_kind(store, pin_memory, writer)
        self.target = target
        self.store = store
        self.paths = target.attempt_paths
        self.attempt = target.attempt
        self.fence = target.fence
        self.on_commit = target.on_commit
        self.log = target.log
        self.totals = CheckpointerTotals()
        self._spacing = Spacing(target.min_interval_s)
        self._spool = owned_dirs.make(SPOOL_PREFIX, store.scratch_dir())
        self._inflight: Optional[_InFlight] = None
        self._cancelled = threading.Event()
        self._commit_lock = threading.Lock()  # held while a manifest write may be under way
        self._work = CommitWork(target, self._spool, self._gate, self._cancelled.is_set)
        # the thread writer: niced when BATON_BACKGROUND_NICE says so (priority.py)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="baton-checkpoint",
                                        initializer=lower_this_thread, initargs=(nice,))
        self._shared: Optional[SharedBuffers] = None
        self._process = None
        if self.writer == "thread":
            writer_start.discard()  # a writer process started ahead has nothing to do here
        if self.writer == "process":
            from baton.storage.checkpointing.writer_process import ProcessWriter

            self._shared = SharedBuffers(self._spool, target.log)
            config = {"store_url": store.reopen_url(), "job_id": target.paths.job_id, "attempt": target.attempt,
                      "keep_last": target.keep_last, "spool": str(self._spool), "upload_retry_s": target.upload_retry_s,
                      "nice": nice}
            self._process = ProcessWriter(config, target.fence, self._commit_lock, self._cancelled, target.log)
        self._snapshot = HostSnapshot(pin_memory=pin_memory, shared=self._shared)

    # --- called by the training loop -------------------------------------------------------
    def save(self, capture: Callable[[], dict[str, Any]], request: CheckpointRequest, mandatory: bool,
             stable: Optional[Collection[int]] = None) -> bool:
        """Snapshot the state ``capture()`` returns and commit it in the background; False when
        skipped (see the policy above). The stall is all the loop waits here: for a checkpoint
        still in flight (mandatory ones only), the capture and the snapshot.

        ``stable``: storage keys of the tensors only ``optimizer.step`` modifies; on CUDA their
        device-to-host copy then overlaps the next forward/backward, and the loop must call
        ``before_optimizer_step()`` (snapshot.py)."""
        busy = self._inflight is not None and not self._inflight.future.done()
        # (a test holding commits has every checkpoint taken)
        if not mandatory and (busy or self._spacing.too_soon()) and not failpoints.held():
            self.totals.skipped += 1
            return False
        self._spacing.taken()
        started = time.perf_counter()  # a wait for the checkpoint in flight blocks the loop too
        self.wait()
        snapshot = self._snapshot.take(capture(), stable)
        stats = CheckpointStats(self.paths.checkpoint(request.step), request.kind, time.perf_counter() - started)
        self.totals.taken += 1
        finish = lambda committed: self._finish(committed, stats)  # noqa: E731
        if self._process is not None and self._shared is not None and self._process.ready.is_set():
            future = self._process.submit(self._shared.to_slots(snapshot), request, stats.key, finish)
        else:  # the thread writer (also while the writer process is still starting)
            future = self._pool.submit(self._write_in_thread, snapshot, self._snapshot.copies, request, stats.key, finish)
        self._inflight = _InFlight(future, stats)
        return True

    def checkpoint_key(self, step: int) -> str:
        """Where the checkpoint of ``step`` is written (for the metrics rows)."""
        return self.paths.checkpoint(step)

    def describe(self) -> str:
        done = self.totals.done
        stall_ms = 1000 * sum(stats.stall_s for stats in done) / len(done) if done else 0.0
        return (f"{self.totals.taken} checkpoint(s) taken, {self.totals.skipped} skipped; mean stall {stall_ms:.2f} ms "
                f"({self.writer} writer)")

    def wait_for_writer(self, timeout_s: float = 60.0) -> bool:
        """Block until the writer process has started (True at once for the thread writer); until
        then checkpoints are written by the thread. For benchmarks and tests that measure it."""
        return self._process is None or self._process.ready.wait(timeout_s)

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
        """Finish the checkpoint in flight (raising its error), then release the writer and spool."""
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
            if self._process is not None:
                self._process.shutdown()
            if self._shared is not None:
                self._shared.close()
            shutil.rmtree(self._spool, ignore_errors=True)

    def abandon(self) -> None:
        """Shut down after a failure elsewhere (fenced out, the job's code failed, storage gone):
        cancel the checkpoint in flight rather than wait for its upload (up to UPLOAD_RETRY_S).

        Returns at once, except while a manifest write is under way (one request): from then on
        nothing of this checkpointer is committed. An upload still running finishes in the
        background as an unreferenced object, which a later commit garbage-collects. Errors of the
        checkpoint in flight are logged, not raised, so the original failure is the one reported."""
        self._cancelled.set()
        if self._process is not None:
            self._process.mark_cancelled()  # the writer's retries stop: the lock below is not held for long
        with self._commit_lock:
            pass  # a commit that passed its cancellation check has landed (or failed) now
        inflight, self._inflight = self._inflight, None
        if inflight is not None and inflight.future.done() and inflight.future.exception() is not None:
            exc = inflight.future.exception()
            self.log(f"checkpoint in flight failed while stopping: {type(exc).__name__}: {exc}")
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._process is not None:
            self._process.cancel()  # the writer exits by itself, removing nothing a reader can reach
        if self._shared is not None:
            self._shared.close()
        if inflight is None or inflight.future.done():
            shutil.rmtree(self._spool, ignore_errors=True)
        else:
            inflight.future.add_done_callback(lambda _: shutil.rmtree(self._spool, ignore_errors=True))

    # --- the writer ----------------------------------------------------------------------------
    def _write_in_thread(self, snapshot: Any, copies: Copies, request: CheckpointRequest, key: str,
                         finish: Callable[[Committed], None]) -> Committed:
        copies.wait_all()  # CUDA copies still landing in the host buffers (none on the CPU)
        committed = self._work.run(snapshot, request, key)
        finish(committed)
        return committed

    def _gate(self, swap: Callable[[], Any]) -> Any:
        """The thread writer's fence: the swap runs under the commit lock, after the fence passed."""
        with self._commit_lock:
            self._work.check_cancelled()
            self.fence()
            return swap()

    def _finish(self, committed: Committed, stats: CheckpointStats) -> None:
        stats.write_s = committed.write_s
        stats.bytes = committed.size
        self.on_commit(committed.manifest, stats)
