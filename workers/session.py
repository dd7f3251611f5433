"""One attempt at a job: claim it, resume from the latest good checkpoint, train, finalize.

Shared by ``baton run`` (in-process) and the Celery task, which differ only in their
LoopControl and their fence.
"""
from __future__ import annotations

import socket
import traceback
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from jobs.logs import BATON_STREAM
from schemas.errors import FencedOut, TransientError
from schemas.manifest import CheckpointManifest
from schemas.spec import JobSpec
from storage.base import ObjectStore
from storage.checkpointer import UPLOAD_RETRY_S, AsyncCheckpointer, CheckpointStats
from storage.layout import JobPaths
from storage.manifest_store import ManifestStore

from . import rng, train_state
from .components import build_components
from .control import LoopControl
from .determinism import configure, resolve_device
from .finalize import finalize
from .loop import Outcome, TrainingLoop
from .resume import load_latest_good, pin_resume_point
from .job_logs import JobLogCapture
from .mlflow_tracking import MlflowTracker, tracking_uri
from .tracking import TensorBoardTracker, TrackedControl


@dataclass
class AttemptResult:
    outcome: Outcome
    resumed_from_step: Optional[int]
    report: Optional[dict] = None


def run_attempt(
    spec: JobSpec,
    job_id: str,
    store: ObjectStore,
    attempt: int,
    control: LoopControl,
    *,
    on_commit: Callable[[CheckpointManifest, CheckpointStats], None] = lambda manifest, stats: None,
    worker: Optional[str] = None,
    job_log: bool = False,
    **options,
) -> AttemptResult:
    """One attempt (``_attempt``), with its metrics rows also written as TensorBoard event files
    (``tracking.py``) and, where MLFLOW_TRACKING_URI is set, to the job's MLflow run
    (``mlflow_tracking.py``), fed by the control's callbacks and the commits. ``worker`` names where
    it runs (MLflow's ``baton.worker`` tag). ``job_log``: every line the process writes meanwhile
    goes into the attempt's own log in object storage (``job_logs.py``; ``baton logs``)."""
    where = worker or f"local@{socket.gethostname()}"
    capture = None
    if job_log:
        try:
            capture = JobLogCapture(store, JobPaths(job_id, attempt)).start(
                f"attempt {attempt} of job {job_id} started on {where}")
        except OSError as exc:  # no pipes left: the job runs without its own log rather than not at all
            control.log(f"this attempt keeps no log of its own ({type(exc).__name__}: {exc})")
    ending = "stopped by an exception"
    try:
        result = _tracked_attempt(spec, job_id, store, attempt, control, on_commit, where, **options)
        ending = _ending(result.outcome)
        return result
    except BaseException as exc:
        ending = f"{'interrupted' if isinstance(exc, INFRASTRUCTURE) else 'failed'}: {type(exc).__name__}: {exc}"
        if capture is not None and not isinstance(exc, INFRASTRUCTURE):
            for line in traceback.format_exc().splitlines():
                capture.line(BATON_STREAM, line)
        raise
    finally:
        if capture is not None:
            capture.close(ending)


def _tracked_attempt(spec: JobSpec, job_id: str, store: ObjectStore, attempt: int, control: LoopControl,
                     on_commit: Callable[[CheckpointManifest, CheckpointStats], None], worker: str,
                     **options) -> AttemptResult:
    tracker = TensorBoardTracker(store, JobPaths(job_id, attempt), control.log)
    tracked = TrackedControl(control, tracker)
    commits = [on_commit, tracked.on_commit]
    mlflow = _mlflow_tracker(spec, job_id, store, attempt, worker, control)
    if mlflow is not None:
        tracked = TrackedControl(tracked, mlflow)
        commits.append(tracked.on_commit)
    try:
        result = _attempt(spec, job_id, store, attempt, tracked, on_commit=_chain(*commits), **options)
    except BaseException as exc:
        if mlflow is not None:
            mlflow.finish("RUNNING" if isinstance(exc, INFRASTRUCTURE) else "FAILED")
        raise
    else:
        if mlflow is not None:
            mlflow.finish(_run_status(result.outcome))
    finally:
        tracker.close()
        if mlflow is not None:
            mlflow.close()
    return result


def _ending(outcome: Outcome) -> str:
    if outcome.completed:
        return "succeeded" if outcome.reason is None else outcome.reason
    return f"stopped ({outcome.reason}) at step {outcome.step} after a checkpoint"


INFRASTRUCTURE = (FencedOut, TransientError, KeyboardInterrupt, SystemExit)
"""Exceptions after which the job goes on (another attempt): its MLflow run stays RUNNING."""


def _run_status(outcome: Outcome) -> str:
    if outcome.completed:
        return "FINISHED"
    return "KILLED" if outcome.reason == "cancelled" else "RUNNING"


def _mlflow_tracker(spec: JobSpec, job_id: str, store: ObjectStore, attempt: int, worker: str,
                    control: LoopControl) -> Optional[MlflowTracker]:
    uri = tracking_uri()
    if uri is None:
        return None
    return MlflowTracker(uri, store, JobPaths(job_id, attempt), spec.model_dump(mode="json"), spec.checkpoint.monitor,
                         worker, control.log)


def _chain(*callbacks: Callable[[CheckpointManifest, CheckpointStats], None]):
    def on_commit(manifest: CheckpointManifest, stats: CheckpointStats) -> None:
        for callback in callbacks:
            callback(manifest, stats)
    return on_commit


def _attempt(
    spec: JobSpec,
    job_id: str,
    store: ObjectStore,
    attempt: int,
    control: LoopControl,
    *,
    allowed_prefixes: tuple[str, ...] = (),
    fence: Callable[[], None] = lambda: None,
    on_commit: Callable[[CheckpointManifest, CheckpointStats], None] = lambda manifest, stats: None,
    upload_retry_s: float = UPLOAD_RETRY_S,
) -> AttemptResult:
    paths = JobPaths(job_id)
    manifests = ManifestStore(store, paths)
    manifest = manifests.update(attempt, lambda m: None)  # claim: older attempts are fenced out from here
    if manifest.completed:
        return AttemptResult(Outcome(True, "already completed"), None)

    state, entry = load_latest_good(store, manifest, control.log)
    pin_resume_point(manifests, attempt, entry, control.log)

    device = resolve_device(spec.resources.device)
    threads = spec.resources.cpu_threads or (state["config"]["cpu_threads"] if state else torch.get_num_threads())
    configure(spec.loop.deterministic, threads)
    rng.seed_all(spec.seed)
    parts = build_components(spec, device, allowed_prefixes)
    checkpointer = AsyncCheckpointer(store, paths, attempt, spec.checkpoint.keep_last, fence=fence, on_commit=on_commit,
                                     pin_memory=device.type == "cuda", upload_retry_s=upload_retry_s, log=control.log)
    loop = TrainingLoop(parts, checkpointer, control, threads)
    if state is not None:
        loop.progress, loop.best, loop.metrics = train_state.restore(parts, state)
        control.on_resume(entry.step, entry.epoch, entry.batch_in_epoch, attempt)
    try:
        outcome = loop.run()
    except BaseException:
        checkpointer.abandon()
        raise
    checkpointer.close()
    report = None
    if outcome.completed:
        report = finalize(store, paths, attempt, spec.model_dump(mode="json"), parts.model, loop.metrics,
                          loop.best.state_dict(), fence, control.log)
    return AttemptResult(outcome, entry.step if entry else None, report)
