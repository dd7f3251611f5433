"""One attempt at a job: claim it, resume from the latest good checkpoint, train, finalize.

Shared by ``baton run`` (in-process) and a worker's training process, which differ only in their
``AttemptOptions``: the loop's control, the fence before each commit, who hears of commits, where
the attempt keeps its copies in memory, and how its other ranks are reached.
"""
from __future__ import annotations

import dataclasses
import shutil
import socket
from dataclasses import dataclass
from typing import Callable, Optional

from baton.schemas.errors import FencedOut, TransientError, formatted_traceback
from baton.schemas.manifest import CheckpointManifest
from baton.schemas.messages import Outcome
from baton.schemas.spec import JobSpec
from baton.storage import owned_dirs
from baton.storage.checkpointing.checkpointer import SPOOL_PREFIX
from baton.storage.checkpointing.contract import UPLOAD_RETRY_S, CheckpointStats
from baton.storage.job_log import BATON_STREAM
from baton.storage.layout import JobPaths
from baton.storage.manifest_store import ManifestStore
from baton.storage.stores.base import ObjectStore
from baton.workers.attempt.resume import ResumePoint
from baton.workers.attempt.scratch import remove_orphaned_scratch
from baton.workers.attempt.training import train_attempt
from baton.workers.parallel.nodes import Peers
from baton.workers.tracking.job_logs import JobLogCapture
from baton.workers.tracking.mlflow_tracking import MlflowTracker, tracking_uri
from baton.workers.tracking.tensorboard import TensorBoardTracker, TrackedControl
from baton.workers.training.control import LoopControl

OnCommit = Callable[[CheckpointManifest, CheckpointStats], None]


def _no_fence() -> None:
    pass


def _ignore_commit(manifest: CheckpointManifest, stats: CheckpointStats) -> None:
    pass


@dataclass(frozen=True)
class Attempt:
    """One attempt at a job: the job's spec and id, the attempt's number, the store its state is kept
    in, the modules its code may import, the nonce of the claim holding it (None: none to check), and
    where it pauses (``pause_at``: epochs done, or steps; None: it trains to its end)."""

    spec: JobSpec
    job_id: str
    number: int
    store: ObjectStore
    allowed_prefixes: tuple[str, ...] = ()
    claim: Optional[str] = None
    import_path: tuple[str, ...] = ()  # the job's shipped code and packages here (its ranks import them first)
    pause_at: Optional[int] = None

    @property
    def paths(self) -> JobPaths:
        return JobPaths(self.job_id)


@dataclass(frozen=True)
class AttemptOptions:
    """How whoever runs an attempt takes part in it: the loop's ``control``, the ``fence`` run before every
    commit, ``on_commit``, how long storage is retried, ``worker`` (where it runs: the job log and
    MLflow say so), whether the attempt keeps a ``job_log`` of its own in the store, the directories of
    the job's copies in ``memory`` (one process's state), and ``peers``: how its rank 0 reaches the
    other nodes of a multi-node group (None: the group is this node's ranks)."""

    control: LoopControl
    fence: Callable[[], None] = _no_fence
    on_commit: OnCommit = _ignore_commit
    upload_retry_s: float = UPLOAD_RETRY_S
    worker: Optional[str] = None
    job_log: bool = False
    setup_log: tuple[str, ...] = ()  # what the worker did before the attempt (its shipped code): logged first
    memory: Optional[tuple[str, ...]] = None
    peers: Optional[Peers] = None


@dataclass
class AttemptResult:
    outcome: Outcome
    resumed_from_step: Optional[int]
    report: Optional[dict] = None


INFRASTRUCTURE = (FencedOut, TransientError, KeyboardInterrupt, SystemExit)
"""Exceptions after which the job goes on (another attempt): its MLflow run stays RUNNING."""


def run_attempt(attempt: Attempt, options: AttemptOptions) -> AttemptResult:
    """The attempt (``_claimed``), with its metrics rows also written as TensorBoard event files and,
    where MLFLOW_TRACKING_URI is set, to the job's MLflow run, fed by the control's callbacks and the
    commits. With ``options.job_log`` every line the process writes meanwhile goes into the attempt's
    own log in object storage (``baton logs``)."""
    control = options.control
    where = options.worker or f"local@{socket.gethostname()}"
    remove_orphaned_scratch(attempt.store, control.log)  # a process killed outright on this machine left them
    capture = None
    if options.job_log:
        try:
            capture = JobLogCapture(attempt.store, JobPaths(attempt.job_id, attempt.number)).start(
                f"attempt {attempt.number} of job {attempt.job_id} started on {where}")
            for line in options.setup_log:
                capture.line(BATON_STREAM, line)
        except OSError as exc:  # no pipes left: the job runs without its own log rather than not at all
            control.log(f"this attempt keeps no log of its own ({type(exc).__name__}: {exc})")
    ending = "stopped by an exception"
    try:
        result = _tracked(attempt, dataclasses.replace(options, worker=where))
        ending = _ending(result.outcome)
        return result
    except BaseException as exc:
        ending = f"{'interrupted' if isinstance(exc, INFRASTRUCTURE) else 'failed'}: {type(exc).__name__}: {exc}"
        if capture is not None and not isinstance(exc, INFRASTRUCTURE):
            for line in formatted_traceback(exc).splitlines():
                capture.line(BATON_STREAM, line)
        raise
    finally:
        if capture is not None:
            capture.close(ending)


def _tracked(attempt: Attempt, options: AttemptOptions) -> AttemptResult:
    control = options.control
    tracker = TensorBoardTracker(attempt.store, JobPaths(attempt.job_id, attempt.number), control.log)
    tracked = TrackedControl(control, tracker)
    commits = [options.on_commit, tracked.on_commit]
    mlflow = _mlflow_tracker(attempt, options.worker or "", control)
    if mlflow is not None:
        tracked = TrackedControl(tracked, mlflow)
        commits.append(tracked.on_commit)
    try:
        result = _claimed(attempt, dataclasses.replace(options, control=tracked, on_commit=_chain(*commits)))
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


def _run_status(outcome: Outcome) -> str:
    if outcome.completed:
        return "FINISHED"
    return "KILLED" if outcome.reason == "cancelled" else "RUNNING"


def _mlflow_tracker(attempt: Attempt, worker: str, control: LoopControl) -> Optional[MlflowTracker]:
    uri = tracking_uri()
    if uri is None:
        return None
    return MlflowTracker(uri, attempt.store, JobPaths(attempt.job_id, attempt.number),
                         attempt.spec.model_dump(mode="json"), attempt.spec.checkpoint.monitor, worker, control.log)


def _chain(*callbacks: OnCommit) -> OnCommit:
    def on_commit(manifest: CheckpointManifest, stats: CheckpointStats) -> None:
        for callback in callbacks:
            callback(manifest, stats)
    return on_commit


def _claimed(attempt: Attempt, options: AttemptOptions) -> AttemptResult:
    """Claim the manifest (older attempts, and another claim of this number, are fenced out from here),
    then resume and train in a scratch directory of this process's (a sharded checkpoint is downloaded there)."""
    manifests = ManifestStore(attempt.store, attempt.paths)
    manifest = manifests.update(attempt.number, lambda m: None, claim=attempt.claim)
    if manifest.completed:
        return AttemptResult(Outcome(completed=True, reason="already completed"), None)
    scratch = owned_dirs.make(SPOOL_PREFIX, attempt.store.scratch_dir())
    try:
        outcome, point, report = train_attempt(attempt, options, manifest, scratch)
        return AttemptResult(outcome, point.step if isinstance(point, ResumePoint) else None, report)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
