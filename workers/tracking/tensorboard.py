"""TensorBoard event files of a job's metrics rows, one file per attempt, under the attempt's prefix.

Every metrics row (one per validation) becomes scalars at its ``step``: ``train_loss``, each
``val_NAME``, ``lr``, ``grad_norm``, ``samples_per_s``. They are written with
``torch.utils.tensorboard.SummaryWriter`` into a local temporary directory and the event file is
uploaded through the ObjectStore to ``jobs/<id>/attempt-<n>/tensorboard/<file>``.

A row is written only once a checkpoint at or after its step is committed: a row that no commit
covers is produced again by the next attempt (which resumes before it), so writing it early would
put that step in two event files. At its first commit an attempt also reconciles with the attempts
before it, as the MLflow tracker does: it reads the committed rows (``metrics.jsonl`` through the
manifest) and the steps the earlier attempts' event files hold (``tensorboard_history.py``), and
writes every committed row whose step no earlier event file holds, its own and its predecessors'
(one killed between a commit and its upload), and no other (one trained again after a fallback past
a corrupt checkpoint). Then each committed row is in exactly one event file across the attempts.

Tracking never fails or slows a job: the loop and the checkpointer only put items on a queue; one
background thread imports TensorBoard, writes and uploads. Its failures are logged and counted
(``baton_tracking_failures_total``), and an attempt waits at most ``CLOSE_WAIT_S`` for it at the end.
"""
from __future__ import annotations

import logging
import queue
import shutil
import threading
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from baton.schemas.manifest import CheckpointManifest
from baton.schemas.metrics import val_metrics
from baton.storage import owned_dirs
from baton.storage.artifacts import read_metrics
from baton.storage.stores.base import ObjectStore
from baton.storage.checkpointing.contract import CheckpointStats
from baton.storage.layout import JobPaths
from baton.storage.manifest_store import ManifestStore
from baton.storage.checkpointing.priority import lower_this_thread
from baton.workers.training.control import LoopControl, StepReport

from baton.workers.tracking import prometheus
from baton.workers.tracking.tensorboard_history import EVENT_FILE_PREFIX, steps_written_before

_log = logging.getLogger("baton.tracking")
# TensorBoard's own INFO lines ("No path found after ...", from reading an earlier attempt's event
# files) are not the job's: its warnings and errors still reach the job's log
logging.getLogger("tensorboard").setLevel(logging.WARNING)

TRACKER = "tensorboard"
ROW_SCALARS = ("train_loss", "lr", "grad_norm", "samples_per_s")
CURVE_TAG = "train_loss_per_step"
"""The tag of a row's per-step training curve (``train_curve``)."""
"""The fixed fields of a row written as scalars, besides every val_NAME."""
CLOSE_WAIT_S = 30.0
"""Longest an attempt waits at its end for the last event file upload (then it goes without)."""
LOCAL_DIR_PREFIX = "baton-tensorboard-"
"""The local directories' names (``owned_dirs.py``: those of a process killed outright are removed by
the next worker or ``baton run`` started on the machine)."""
MISSING = "TensorBoard is not installed: no event files for this job (pip install 'baton[tensorboard]')"


def row_scalars(row: dict) -> dict[str, float]:
    """The scalars a metrics row becomes, by tag."""
    return {**{k: row[k] for k in ROW_SCALARS if k in row}, **val_metrics(row)}


def preload() -> None:
    """Import TensorBoard's writer now, before training starts. Imported by the tracker's thread at
    the first commit instead, it held the GIL against the training loop for its whole import (0.2 s
    alone here): on the spiral example that put ~3-4 ms on each epoch of a 60-epoch run's slope."""
    from baton.workers.training import rng

    try:
        with rng.kept_through_imports():
            import torch.utils.tensorboard  # noqa: F401  optional: baton[tensorboard]
            from tensorboard.backend.event_processing import event_accumulator  # noqa: F401  reads earlier attempts'
    except Exception as exc:  # not installed, or a broken install (protobuf, numpy): tracking never fails a job
        _log.debug("TensorBoard not preloaded (%s: %s); the tracker's thread says why at its first write",
                   type(exc).__name__, exc)


class TensorBoardTracker:
    """Feeds one attempt's event file. ``row``, ``committed``, ``resumed_from`` never block."""

    def __init__(self, store: ObjectStore, paths: JobPaths, log: Callable[[str], None]):
        preload()
        self.store, self.paths, self.log = store, paths, log
        self._queue: "queue.Queue[tuple[str, Any]]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=f"baton-tensorboard-{paths.job_id}", daemon=True)
        self._thread.start()

    # --- called from the loop and the checkpointer ---------------------------------------------
    def resumed_from(self, step: int) -> None:
        """Nothing to do: the committed rows and the earlier attempts' event files decide what this
        attempt writes, not where it resumed (a killed predecessor's last rows may be in no file)."""

    def row(self, row: dict) -> None:
        self._queue.put(("row", dict(row)))

    def committed(self, step: int) -> None:
        self._queue.put(("commit", step))

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Write and upload what is committed, then stop; waits at most ``wait_s``."""
        self._queue.put(("close", None))
        self._thread.join(wait_s)
        if self._thread.is_alive():
            prometheus.TRACKING_FAILURES.labels(TRACKER).inc()
            _log.warning("job %s: the TensorBoard upload did not finish within %.0fs; the job goes on without it",
                         self.paths.job_id, wait_s)

    # --- the background thread --------------------------------------------------------------------
    def _run(self) -> None:
        try:
            lower_this_thread()  # niced like the checkpoint thread when BATON_BACKGROUND_NICE says so
        except ValueError:  # a bad setting: the checkpointer refuses it when the attempt starts
            pass
        state = _WriterState(self.paths)
        try:
            while True:
                kind, value = self._queue.get()
                if kind == "close":
                    self._guard(state, lambda: state.upload(self.store), "upload")
                    return
                if kind == "row":
                    state.pending.append(value)
                elif kind == "commit":
                    self._guard(state, lambda: state.write_committed(value, self.store), "write")
                    if self._queue.empty():  # a burst of commits uploads once
                        self._guard(state, lambda: state.upload(self.store), "upload")
        finally:
            state.cleanup()

    def _guard(self, state: "_WriterState", action: Callable[[], None], what: str) -> None:
        if state.disabled:
            return
        try:
            action()
        except ImportError:
            state.disabled = True
            self.log(MISSING)
        except Exception as exc:  # tracking must never fail the job: logged, counted, retried at the next commit
            prometheus.TRACKING_FAILURES.labels(TRACKER).inc()
            _log.warning("job %s: TensorBoard %s failed (%s: %s); training goes on", self.paths.job_id, what,
                         type(exc).__name__, exc)


class _WriterState:
    """What only the tracker's thread touches: the SummaryWriter, the rows not yet committed, the
    steps already in an event file."""

    def __init__(self, paths: JobPaths):
        self.paths = paths
        self.pending: list[dict] = []
        self.written: Optional[set[int]] = None  # steps in an event file: None until reconciled
        self.disabled = False
        self.dirty = False
        self._dir: Optional[Path] = None
        self._writer = None

    def _local(self) -> Path:
        if self._dir is None:
            self._dir = owned_dirs.make(LOCAL_DIR_PREFIX)
        return self._dir

    def _open(self):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # optional: baton[tensorboard]

            self._writer = SummaryWriter(log_dir=str(self._local()))
        return self._writer

    def _reconcile(self, store: ObjectStore) -> None:
        """Once, at the first commit: the committed rows join the pending ones (a killed
        predecessor's among them), and the steps earlier event files hold are never written again.
        A failure is retried at the next commit."""
        import tensorboard  # noqa: F401  without it nothing is written: say so (ImportError) before reading

        held = steps_written_before(store, self.paths, self._local() / "earlier")
        pending = {row["step"] for row in self.pending}
        committed = read_metrics(store, ManifestStore(store, self.paths).read())
        self.pending = sorted(self.pending + [row for row in committed if row["step"] not in pending],
                              key=lambda row: row["step"])
        self.written = held

    def write_committed(self, step: int, store: ObjectStore) -> None:
        """Write the rows a commit at ``step`` covers (their steps are <= it) that no event file holds."""
        if self.written is None:
            self._reconcile(store)
        written = self.written
        assert written is not None  # (reconciled)
        ready = [row for row in self.pending if row["step"] <= step]
        self.pending = [row for row in self.pending if row["step"] > step]
        for row in ready:
            if row["step"] in written:
                continue
            writer = self._open()
            for tag, value in row_scalars(row).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    writer.add_scalar(tag, value, global_step=row["step"])
            for point_step, loss in row.get("train_curve", []):  # the steps the row covers: written with it, once
                writer.add_scalar(CURVE_TAG, loss, global_step=int(point_step))
            written.add(row["step"])
            self.dirty = True

    def upload(self, store: ObjectStore) -> None:
        if not self.dirty or self._writer is None:
            return
        self._writer.flush()
        for path in sorted(self._dir.glob(f"{EVENT_FILE_PREFIX}*")):
            store.put_file(self.paths.tensorboard_file(path.name), path)
        self.dirty = False

    def cleanup(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception as exc:  # the file is uploaded already or never will be; nothing to keep
                _log.debug("closing the SummaryWriter: %s", exc)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


class Tracker(Protocol):
    """What a control feeds a tracker (TensorBoard's, MLflow's): the resume, every row, every commit."""

    def resumed_from(self, step: int) -> None: ...

    def row(self, row: dict) -> None: ...

    def committed(self, step: int) -> None: ...


class TrackedControl(LoopControl):
    """``inner`` (the worker's or ``baton run``'s control), plus the tracker fed by its callbacks."""

    def __init__(self, inner: LoopControl, tracker: Tracker):
        self.inner, self.tracker = inner, tracker

    def stop_reason(self) -> Optional[str]:
        return self.inner.stop_reason()

    def on_step(self, report: StepReport) -> None:
        self.inner.on_step(report)

    def on_epoch(self, row: dict) -> None:
        self.tracker.row(row)
        self.inner.on_epoch(row)

    def on_resume(self, step: int, epoch: int, batch_in_epoch: int, attempt: int, source: str = "checkpoint") -> None:
        self.tracker.resumed_from(step)
        self.inner.on_resume(step, epoch, batch_in_epoch, attempt, source)

    def log(self, message: str) -> None:
        self.inner.log(message)

    def on_commit(self, manifest: CheckpointManifest, stats: CheckpointStats) -> None:
        """Chained after the runner's own on_commit: rows up to the committed step may be written."""
        if manifest.latest is not None:
            self.tracker.committed(manifest.latest.step)
