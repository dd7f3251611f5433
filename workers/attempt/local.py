"""``baton run``: a job in this process, no Redis. Ctrl-C or SIGTERM checkpoints and stops."""
from __future__ import annotations

import json
import signal
from typing import Optional

from tqdm import tqdm

from baton.schemas.errors import FencedOut, PreconditionFailed, RunningElsewhere, SpecError
from baton.schemas.spec import JobSpec
from baton.storage.stores.base import ObjectStore
from baton.storage.layout import JobPaths, check_job_id
from baton.storage.manifest_store import ManifestStore
from baton.storage.run_lease import LocalLease
from baton.workers.training.control import LoopControl, StepReport, describe_row, describe_source
from baton.workers.training.determinism import prepare_process

from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt

EXIT_DONE = 0
EXIT_STOPPED = 3
"""Stopped by a signal after a committed checkpoint: the same --id resumes it."""
EXIT_RUNNING_ELSEWHERE = 4
"""Another live ``baton run`` holds the job: nothing was done."""


class LocalControl(LoopControl):
    """Signals and a progress bar. The first SIGINT/SIGTERM stops at the next step boundary after a
    checkpoint; a second one exits at once."""

    def __init__(self, job_id: str, progress_bar: bool, lease: Optional[LocalLease] = None):
        self.job_id, self.lease = job_id, lease
        self._stop: Optional[str] = None
        self._finished = False
        self._bar: Optional[tqdm] = None
        self._progress_bar = progress_bar
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame) -> None:
        if self._stop is not None:
            raise SystemExit(128 + signum)
        self._stop = "interrupted"
        self.log(f"{signal.Signals(signum).name}: checkpointing at the next step, then stopping (again to abort)")

    def stop_reason(self) -> Optional[str]:
        if self.lease is not None and self.lease.lost.is_set():
            raise FencedOut(f"job {self.job_id}: another run took it over")
        return self._stop

    def on_step(self, report: StepReport) -> None:
        if not self._progress_bar:
            return
        if self._bar is None:
            self._bar = tqdm(total=report.total_steps, initial=report.step - 1, unit="step", dynamic_ncols=True)
        self._bar.update(report.step - self._bar.n)
        where = {"epoch": f"{report.epoch + 1}/{report.epochs}"} if report.epochs else {}
        self._bar.set_postfix(**where, loss=f"{report.loss:.4f}", lr=f"{report.lr:.2e}",
                              sps=f"{report.samples_per_s:.0f}", refresh=False)

    def on_epoch(self, row: dict) -> None:
        self.log(describe_row(row))

    def on_resume(self, step: int, epoch: int, batch_in_epoch: int, attempt: int, source: str = "checkpoint") -> None:
        self.log(f"resuming {self.job_id} from {describe_source(source)}step {step} (epoch {epoch + 1}, batch "
                 f"{batch_in_epoch}) as attempt {attempt}")

    def log(self, message: str) -> None:
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def finished(self) -> None:
        """The job has completed: from now on SIGINT and SIGTERM are ignored, to the process's very end
        (late in the interpreter's shutdown Python restores the default handlers, but not an ignored
        signal's), so that a finished job always exits 0."""
        self._finished = True
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def register_spec(store: ObjectStore, paths: JobPaths, spec: JobSpec) -> None:
    """Store spec.json (a conditional create: of two runs racing, one spec is stored), or check that
    the job's stored spec is this one (a resume must not change it)."""
    if not store.exists(paths.spec):
        try:
            store.put_if(paths.spec, spec.model_dump_json(indent=2).encode(), None)
            return
        except PreconditionFailed:
            pass  # another run stored its spec first: it must be this one
    if store.exists(paths.spec):
        stored = JobSpec.parse(json.loads(store.get_bytes(paths.spec)))
        if stored.resources.processes != spec.resources.processes and not spec.resources.reshard:
            how = (" or set resources.reshard: true to load its sharded checkpoints onto the new count (not "
                   "bit-exact)") if spec.resources.strategy == "fsdp" else ""
            raise SpecError([f"resources.processes: job {paths.job_id} runs as {stored.resources.processes} process(es); "
                             f"this spec asks for {spec.resources.processes}. A job resumes exactly only with the same "
                             f"count (each rank's RNG and data share are in its checkpoints); use a new --id{how}"])
        if _resumable_as(stored, spec.resources.reshard) != _resumable_as(spec, spec.resources.reshard):
            raise SpecError([f"spec: job {paths.job_id} already exists with a different spec; use a new --id"])


def _resumable_as(spec: JobSpec, any_count: bool) -> JobSpec:
    """What must stay the same for a run to resume a job: all of its spec but resources.reshard, and with
    ``any_count`` (a sharded job resharded) its count of ranks. The job's spec.json keeps the spec it was
    created with."""
    resources = spec.resources.model_copy(update={"reshard": False, **({"processes": 1} if any_count else {})})
    return spec.model_copy(update={"resources": resources})


def _refuse_if_queued(store: ObjectStore, paths: JobPaths) -> None:
    """A queue's job is its workers': this run would fence out the one holding it, and be fenced out by the next."""
    if store.exists(paths.queued):
        raise RunningElsewhere(f"job {paths.job_id} was submitted to a queue, whose workers run it (baton status "
                               f"{paths.job_id}); baton run runs only the jobs it started: use a new --id to train it here")


def run_local(spec: JobSpec, job_id: str, store: ObjectStore, allowed_prefixes: tuple[str, ...],
              progress_bar: bool) -> int:
    prepare_process()
    check_job_id(job_id)
    if spec.resources.nodes > 1:
        raise SpecError([f"resources.nodes: a job on {spec.resources.nodes} nodes runs on workers (baton submit); "
                         "baton run trains in this process, on this machine only"])
    paths = JobPaths(job_id)
    _refuse_if_queued(store, paths)
    register_spec(store, paths, spec)
    if ManifestStore(store, paths).read().completed:
        print(f"job {job_id} already finished; its artifacts are under {store.url}/{paths.root}")
        return EXIT_DONE
    lease = LocalLease(store, paths).acquire()  # RunningElsewhere while another live run holds the job
    try:
        _refuse_if_queued(store, paths)  # again: a submit may have marked it since the first look
        return _run_held(spec, job_id, store, paths, lease, allowed_prefixes, progress_bar)
    finally:
        lease.release()


def _run_held(spec: JobSpec, job_id: str, store: ObjectStore, paths: JobPaths, lease: LocalLease,
              allowed_prefixes: tuple[str, ...], progress_bar: bool) -> int:
    manifest = ManifestStore(store, paths).read()  # read under the lease: no other run moves it now
    if manifest.completed:
        print(f"job {job_id} already finished; its artifacts are under {store.url}/{paths.root}")
        return EXIT_DONE
    control = LocalControl(job_id, progress_bar, lease)
    try:
        result = run_attempt(Attempt(spec, job_id, manifest.attempt + 1, store, allowed_prefixes, lease.nonce),
                             AttemptOptions(control, job_log=True))
    except SystemExit:  # a second signal: an abort, unless the job had completed before it came
        if not ManifestStore(store, paths).read().completed:
            raise
        control.finished()
        print(f"job {job_id} finished; artifacts under {store.url}/{paths.root}")
        return EXIT_DONE
    finally:
        control.close()
    if result.outcome.completed:
        control.finished()
    if not result.outcome.completed:
        print(f"job {job_id} stopped ({result.outcome.reason}) after a checkpoint; "
              f"run again with --id {job_id} to resume")
        return EXIT_STOPPED
    if result.report:
        for line in result.report["note"]:
            print(line)
    print(f"job {job_id} finished; artifacts under {store.url}/{paths.root}")
    return EXIT_DONE
