"""Training a claimed attempt from where it resumes, then its final artifacts.

A job whose state one process holds trains here (``OneProcess``); any other is a group, which this
process joins as rank 0 after starting the rest (``baton.workers.parallel.nodes``: this node's ranks,
and the other nodes' through the attempt's peers). Every rank assembles its loop the same way
(``baton.workers.training.assembly``); only rank 0 commits, and finalizes.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from baton.schemas.manifest import CheckpointManifest
from baton.schemas.messages import Outcome
from baton.schemas.spec import JobSpec
from baton.storage.checkpointing.contract import CheckpointTarget
from baton.storage.manifest_store import ManifestStore
from baton.storage.memory.memory_copy import MemoryCopier
from baton.workers.attempt.finalize import finalize
from baton.workers.attempt.resume import Resume, ResumePoint, choose_resume, pin_resume_point
from baton.workers.parallel.layouts import layout_for
from baton.workers.parallel.nodes import ThisNode, group_order, start_group
from baton.workers.parallel.reshard import resharding_of
from baton.workers.training.assembly import RankPlan, assemble, run
from baton.workers.training.determinism import MACHINE_THREADS, configure, resolve_device
from baton.workers.training.layout import Layout, OneProcess

if TYPE_CHECKING:
    from baton.workers.attempt.session import Attempt, AttemptOptions

Trained = tuple[Outcome, Optional[ResumePoint], Optional[dict]]
"""The loop's outcome, where the attempt resumed, and the report of a finished job."""


def train_attempt(attempt: "Attempt", options: "AttemptOptions", manifest: CheckpointManifest, scratch: Path) -> Trained:
    spec, log = attempt.spec, options.control.log
    memory = options.memory if spec.resources.single_process else None  # copies hold one process's state
    resume = choose_resume(attempt.store, manifest, memory, scratch, log)
    resharding = resharding_of(resume.state, resume.entry, spec.resources.ranks, spec.resources.reshard, attempt.number)
    if resharding is not None:
        log(resharding.describe())
    pin_resume_point(ManifestStore(attempt.store, attempt.paths), attempt.number, resume.entry, log, resharding)
    saved_threads = resume.state["config"]["cpu_threads"] if resume.state is not None and resharding is None else None
    threads = spec.resources.cpu_threads or saved_threads or default_threads(spec)
    configure(spec.loop.deterministic, threads)
    target = CheckpointTarget(attempt.store, attempt.paths, attempt.number, spec.checkpoint.keep_last, options.fence,
                              options.on_commit, options.upload_retry_s, log, spec.checkpoint.min_interval_s)
    plan = RankPlan(spec, attempt.allowed_prefixes, threads, target, resume.state, attempt.pause_at)
    if spec.resources.single_process:
        return _train(plan, OneProcess(resolve_device(spec.resources.device)), resume, options, memory)
    order = group_order(spec, attempt.job_id, attempt.number, attempt.store.url, threads, attempt.allowed_prefixes,
                        (resume.state, resume.entry)).model_copy(update={"import_path": attempt.import_path,
                                                                         "pause_at": attempt.pause_at})
    ranks, group = start_group(order, options.peers or ThisNode(spec.resources.nodes), log, attempt.store.reopen_url())
    try:
        trained = _train(plan, layout_for(group, spec.resources.strategy, spec.loop.precision), resume, options)
    except BaseException as exc:
        explained = ranks.explain(exc)  # before the other ranks are killed: whether one died first
        ranks.kill()
        group.close()
        if explained is exc:
            raise
        raise explained from exc
    ranks.finish()
    group.close()
    return trained


def _train(plan: RankPlan, layout: Layout, resume: Resume, options: "AttemptOptions",
           memory: Optional[tuple[str, ...]] = None) -> Trained:
    """Rank 0's loop, resumed, trained, and the job finalized when it completes."""
    spec, control = plan.spec, options.control
    every = spec.checkpoint.memory_every_steps
    copier = None if memory is None or every == "off" else MemoryCopier(
        [Path(d) for d in memory], every=None if every == "auto" else every, cuda=layout.device.type == "cuda",
        log=control.log)
    loop = assemble(plan, layout, control, copier)
    point = resume.point
    if point is not None:
        control.on_resume(point.step, point.epoch, point.batch_in_epoch, plan.target.attempt, point.source)
    outcome = run(loop)
    report = None
    if outcome.completed:  # a checkpointer that takes the weights as shards: the last ones come from its checkpoint
        model = loop.parts.model if loop.checkpointer.captures_weights else None
        report = finalize(plan.target, spec.model_dump(mode="json"), model, loop.metrics, loop.best.state_dict())
    return outcome, point, report


def default_threads(spec: JobSpec) -> int:
    """Intra-op threads when the spec sets none: torch's default in a fresh process (the machine's cores,
    whatever this process has set since), shared out among the ranks of a data-parallel job on the CPU
    (ranks that each took every core would contend)."""
    threads = MACHINE_THREADS
    if spec.resources.processes > 1 and resolve_device(spec.resources.device).type == "cpu":
        return max(1, threads // spec.resources.processes)
    return threads
