"""One attempt at a job: claim it, resume from the latest good checkpoint, train, finalize.

Shared by ``baton run`` (in-process) and the Celery task, which differ only in their
LoopControl and their fence.
"""
from __future__ import annotations

import functools
import shutil
import socket
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Optional


from baton.storage.job_log import BATON_STREAM
from baton.schemas.errors import FencedOut, TransientError, formatted_traceback
from baton.schemas.manifest import CheckpointEntry, CheckpointManifest, Reshard
from baton.schemas.spec import JobSpec
from baton.storage.stores.base import ObjectStore
from baton.storage import owned_dirs
from baton.storage.checkpointing.checkpointer import SPOOL_PREFIX, UPLOAD_RETRY_S, AsyncCheckpointer, CheckpointStats
from baton.storage.memory import memory_slots
from baton.storage.checkpoint_io import rows_of
from baton.storage.layout import JobPaths
from baton.storage.memory.memory_copy import MemoryCopier
from baton.storage.memory.memory_slots import InMemoryState
from baton.storage.manifest_store import ManifestStore
from baton.workers.parallel import sharded_state
from baton.workers.parallel.distributed import RankGroup, check_same_processes
from baton.workers.parallel.sharded_checkpoint import ShardedCheckpointer
from baton.workers.parallel import rendezvous
from baton.workers.parallel.launcher import RENDEZVOUS_TIMEOUT_S, Ranks, check_devices
from baton.workers.parallel.reshard import check_reshard, written_by
from baton.workers.tracking.job_logs import JobLogCapture
from baton.workers.tracking.mlflow_tracking import MlflowTracker, tracking_uri
from baton.workers.tracking.tensorboard import TensorBoardTracker, TrackedControl
from baton.workers.training import rng, train_state
from baton.workers.training.components import build_components
from baton.workers.training.control import LoopControl
from baton.workers.training.determinism import MACHINE_THREADS, configure, resolve_device
from baton.workers.training.loop import Outcome, TrainingLoop

from baton.workers.attempt.finalize import finalize
from baton.workers.attempt.gang_leader import GangLeader
from baton.workers.attempt.resume import SHARDS_KEY, load_latest_good, pin_resume_point
from baton.workers.attempt.scratch import remove_orphaned_scratch


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
    remove_orphaned_scratch(store, control.log)  # a process killed outright on this machine left them
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
            for line in formatted_traceback(exc).splitlines():
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
    claim: Optional[str] = None,
    gang: Optional[GangLeader] = None,
    memory: Optional[list[str]] = None,
) -> AttemptResult:
    paths = JobPaths(job_id)
    manifests = ManifestStore(store, paths)
    # claim: older attempts (and another claim of this attempt number) are fenced out from here
    manifest = manifests.update(attempt, lambda m: None, claim=claim)
    if manifest.completed:
        return AttemptResult(Outcome(True, "already completed"), None)

    scratch = owned_dirs.make(SPOOL_PREFIX, store.scratch_dir())  # a sharded checkpoint is downloaded here
    try:
        return _resume_and_train(spec, job_id, store, attempt, control, manifests, manifest, scratch,
                                 allowed_prefixes=allowed_prefixes, fence=fence, on_commit=on_commit,
                                 upload_retry_s=upload_retry_s, gang=gang, memory=memory)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _resume_and_train(spec: JobSpec, job_id: str, store: ObjectStore, attempt: int, control: LoopControl,
                      manifests: ManifestStore, manifest: CheckpointManifest, scratch: Path, *,
                      allowed_prefixes: tuple[str, ...], fence: Callable[[], None],
                      on_commit: Callable[[CheckpointManifest, CheckpointStats], None],
                      upload_retry_s: float, gang: Optional[GangLeader] = None,
                      memory: Optional[list[str]] = None) -> AttemptResult:
    world = spec.resources.ranks
    memory = memory if world == 1 and spec.resources.strategy == "ddp" else None  # one process's state only
    latest = manifest.checkpoints[-1] if manifest.checkpoints else None
    copy = newer_in_memory([Path(d) for d in memory], latest, control.log) if memory else None
    if copy is not None:  # (the durable checkpoint is not read: only its step, to compare)
        state, entry, point = copy.state, latest, ResumePoint(copy.step, copy.epoch, copy.batch_in_epoch, "memory")
    else:
        if memory:  # copies not taken belong to a run this attempt does not continue
            memory_slots.forget([Path(d) for d in memory])
        state, entry = load_latest_good(store, manifest, control.log, scratch)
        point = ResumePoint.of(entry)
    resharding = None
    if state is not None and SHARDS_KEY in state:  # DCP can load it onto another number of ranks
        check_reshard(state, world, spec.resources.reshard)
        if written_by(state) != world:
            resharding = Reshard(step=entry.step, from_ranks=written_by(state), to_ranks=world, attempt=attempt)
            control.log(resharding.describe())
    else:
        check_same_processes(state, world)
    pin_resume_point(manifests, attempt, entry, control.log, resharding)

    saved_threads = state["config"]["cpu_threads"] if state is not None and resharding is None else None
    threads = spec.resources.cpu_threads or saved_threads or default_threads(spec)
    configure(spec.loop.deterministic, threads)
    train = functools.partial(_train, spec, job_id, store, attempt, control, state, point, threads,
                              allowed_prefixes=allowed_prefixes, fence=fence, on_commit=on_commit,
                              upload_retry_s=upload_retry_s, memory=memory)
    if spec.resources.nodes > 1 and gang is None:
        raise TransientError(f"resources.nodes: {spec.resources.nodes}: this attempt has no gang of workers; the job "
                             "goes back to its queue, whose workers form one")
    if world == 1 and spec.resources.strategy == "ddp":
        return train(None)  # (a sharded job of one rank is a group of one: its checkpoints are DCP's)
    shards = state.get(SHARDS_KEY) if state is not None else None
    ranks, group = start_group(spec, job_id, store, attempt, entry, threads, allowed_prefixes, control.log, shards,
                               gang)
    try:
        result = train(group)
    except BaseException as exc:
        explained = ranks.explain(exc)  # before the other ranks are killed: whether one died first
        ranks.kill()
        group.close()
        if explained is exc:
            raise
        raise explained from exc
    ranks.finish()
    group.close()
    return result


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


def default_threads(spec: JobSpec) -> int:
    """Intra-op threads when the spec sets none: torch's default in a fresh process (the machine's cores,
    whatever this process has set since), shared out among the ranks of a data-parallel job on the CPU
    (ranks that each took every core would contend)."""
    threads = MACHINE_THREADS
    if spec.resources.processes > 1 and resolve_device(spec.resources.device).type == "cpu":
        return max(1, threads // spec.resources.processes)
    return threads


def _train(spec: JobSpec, job_id: str, store: ObjectStore, attempt: int, control: LoopControl,
           state: Optional[dict], point: Optional["ResumePoint"], threads: int, group: Optional[RankGroup], *,
           allowed_prefixes: tuple[str, ...], fence: Callable[[], None],
           on_commit: Callable[[CheckpointManifest, CheckpointStats], None], upload_retry_s: float,
           memory: Optional[list[str]] = None) -> AttemptResult:
    """Build, resume, train and finalize; ``group`` is rank 0's place in a data-parallel job, else None.
    ``memory``: the directories of this job's in-memory copies (a single process's state), or None."""
    paths = JobPaths(job_id)
    device = group.device if group is not None else resolve_device(spec.resources.device)
    rng.seed_all(spec.seed)
    place = (group.rank, group.world_size) if group is not None else (0, 1)
    parts = build_components(spec, device, allowed_prefixes, *place,
                             prepare_model=group.prepare_model if group is not None else None)
    sharded = group is not None and group.sharded
    if sharded:  # every rank writes its shard; this one (rank 0) commits
        checkpointer = ShardedCheckpointer(group, parts, store, paths, attempt, spec.checkpoint.keep_last, fence=fence,
                                           on_commit=on_commit, upload_retry_s=upload_retry_s, log=control.log)
    else:
        checkpointer = AsyncCheckpointer(store, paths, attempt, spec.checkpoint.keep_last, fence=fence,
                                         on_commit=on_commit, pin_memory=device.type == "cuda",
                                         upload_retry_s=upload_retry_s, log=control.log)
    try:  # from here on a failure abandons the checkpointer (and ends its writer process)
        saver, loop_control = checkpointer, control
        if group is not None:  # rank 0 of a data-parallel job: a shared stop flag, every rank's state in checkpoints
            parts = group.adopt(parts)
            if not sharded:
                saver = group.checkpointer(checkpointer, parts, checkpointer.paths, lambda: loop.progress)
            loop_control = group.control(control)
        every = spec.checkpoint.memory_every_steps
        copier = None if memory is None or every == "off" else MemoryCopier(
            [Path(d) for d in memory], every=None if every == "auto" else every, cuda=device.type == "cuda",
            log=control.log)
        loop = TrainingLoop(parts, saver, loop_control, threads, group=group, memory=copier)
        if state is not None:
            if sharded:
                loop.progress, loop.best, loop.metrics = sharded_state.restore(parts, Path(state[SHARDS_KEY]), 0,
                                                                               group.world_size, group.checkpoint_group)
            else:
                loop.progress, loop.best, loop.metrics = train_state.restore(parts, state)
                if group is not None:
                    loop.progress = group.restore(parts, state)
            control.on_resume(point.step, point.epoch, point.batch_in_epoch, attempt, point.source)
        outcome = loop.run()
    except BaseException:
        checkpointer.abandon()
        raise
    checkpointer.close()
    if copier is not None:
        copier.close()
        control.log(copier.stats.describe())
    if group is not None:
        control.log(f"rank 0: {saver.describe()}")
    report = None
    if outcome.completed:
        report = finalize(store, paths, attempt, spec.model_dump(mode="json"), None if sharded else parts.model,
                          loop.metrics, loop.best.state_dict(), fence, control.log)
    return AttemptResult(outcome, point.step if point else None, report)


def start_group(spec: JobSpec, job_id: str, store: ObjectStore, attempt: int, entry: Optional[CheckpointEntry],
                threads: int, allowed_prefixes: tuple[str, ...], log: Callable[[str], None],
                shards: Optional[str] = None, gang: Optional[GangLeader] = None) -> tuple[Ranks, RankGroup]:
    """Start this node's other ranks (each resumes from ``entry`` itself, or, sharded, from
    ``shards``: the directory rank 0 downloaded and verified it to) and join the group as rank 0.
    A multi-node attempt's leader (``gang``) serves the rendezvous on a port and publishes it, with
    the ranks' arguments, for the other nodes, which start theirs (``gang_runner``)."""
    device_type = resolve_device(spec.resources.device).type
    check_devices(device_type, spec.resources.processes)
    world = spec.resources.ranks
    args = {"spec": spec.model_dump(mode="json"), "job_id": job_id, "attempt": attempt, "storage_url": store.url,
            "resume_key": entry.key if entry and shards is None else None,
            "resume_sha256": entry.sha256 if entry else None, "resume_dir": shards,
            "cpu_threads": threads, "device_type": device_type, "allowed_prefixes": list(allowed_prefixes)}
    local = range(1, spec.resources.processes)
    if gang is None:
        ranks = Ranks(world, args, log, ranks=local)
    else:
        secret = rendezvous.new_secret()
        served, endpoint = rendezvous.serve_tcp(gang.address, RENDEZVOUS_TIMEOUT_S, secret)
        ranks = Ranks(world, args, log, ranks=local, store=served, endpoint=endpoint, secret=secret,
                      remote=gang.remote_failure, remote_wait_s=gang.loss_wait_s)
    try:
        if gang is not None:
            log(f"multi-node: {gang.nodes} nodes of {spec.resources.processes} rank(s); rendezvous at {endpoint}")
            gang.start(endpoint, ranks.secret, {**args, "world_size": world, "resume_dir": None,
                                                "resume_entry": entry.model_dump(mode="json")
                                                if entry is not None and shards is not None else None})
        ranks.wait_until_ready()
        return ranks, RankGroup.join(ranks.store, 0, world, device_type, spec.seed, ranks.secret,
                                     strategy=spec.resources.strategy, precision=spec.loop.precision)
    except BaseException as exc:
        explained = ranks.explain(exc)
        ranks.kill()
        if explained is exc:
            raise
        raise explained from exc
