"""A rank 1..N-1 of a data-parallel attempt (started by ``baton.workers.parallel.launcher``):
a spare forked ahead of the attempt (``spare_ranks``), a child of a follower's forkserver (``forked_ranks``) or
``python -m baton.workers.parallel.rank_main``.

It builds the same components as rank 0, joins the group, resumes from the checkpoint rank 0
chose (reading and verifying it itself), and runs the same loop without a checkpointer: its RNG
and loader state reach the checkpoint through rank 0 (``distributed.GroupCheckpointer``).
SIGTERM/SIGINT set its stop flag, which the group agrees on at the next optimizer step.
Exit status: 0 when the loop ends; 65 when the job's own code (or spec) failed here, after reporting
it to rank 0 (``failure_report``); 1 when storage or the group failed under it (rank 0 counts a loss).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Callable, Optional

from baton.schemas.messages import GroupOrder, RankOrder
from baton.workers.training.control import LoopControl
from baton.workers.parallel import failure_report
from baton.workers.parallel.failure_report import EXIT_USER_CODE
from baton.workers.parallel.launcher import ARGS_ENV, RENDEZVOUS_TIMEOUT_S, die_with_parent, ready_key
from baton.workers.parallel.rendezvous import SECRET_ENV, connect_tcp, open_store


class RankControl(LoopControl):
    """A rank's own control: a stop flag from signals; its logs go to stderr, prefixed."""

    def __init__(self, rank: int):
        self.rank = rank
        self._stop: Optional[str] = None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame) -> None:
        if self._stop is None:
            self._stop = "interrupted"  # rank 0 decides what a second signal means

    def stop_reason(self) -> Optional[str]:
        return self._stop

    def on_step(self, report) -> None:
        pass

    def on_epoch(self, row: dict) -> None:
        pass

    def on_resume(self, step: int, epoch: int, batch_in_epoch: int, attempt: int, source: str = "checkpoint") -> None:
        pass

    def log(self, message: str) -> None:
        print(f"[rank {self.rank}] {message}", file=sys.stderr, flush=True)


class FailureReporter:
    """Reports the job's code failing on this rank, once (``failure_report``); says whether it did."""

    def __init__(self, directory: Path, rank: int):
        self.directory, self.rank = directory, rank
        self.failed = False

    def __call__(self, exc: BaseException) -> bool:
        if not self.failed and failure_report.is_job_failure(exc):
            self.failed = True
            try:
                failure_report.write(self.directory, self.rank, exc)
            except OSError:  # rank 0 still learns it failed (the exit status); the traceback goes to the log
                traceback.print_exc()
        return self.failed


def run_rank(order: RankOrder, secret: str, report: Callable[[BaseException], bool] = lambda exc: False) -> None:
    """This rank's share of the attempt; a failure of the job's code is passed to ``report`` while
    this rank is still in the group (the others learn of it when its connections close)."""
    from baton.storage.checkpointing.contract import CheckpointTarget
    from baton.storage.layout import JobPaths
    from baton.storage.stores.open import open_store as open_object_store
    from baton.workers.parallel.distributed import RankGroup, RankSeat
    from baton.workers.parallel.layouts import layout_for
    from baton.workers.training.assembly import RankPlan, assemble, run
    from baton.workers.training.determinism import configure, prepare_process

    prepare_process()
    group_order, rank = order.group, order.rank
    sys.path[:0] = group_order.import_path  # the job's shipped code on this node: before anything installed
    spec = group_order.spec
    control = RankControl(rank)
    store = open_object_store(order.store or group_order.storage_url)
    state = _resume_state(group_order, store)
    configure(spec.loop.deterministic, group_order.cpu_threads)
    if order.endpoint:  # a multi-node attempt: its leader's TCP store
        rendezvous = connect_tcp(order.endpoint, RENDEZVOUS_TIMEOUT_S, secret)
    else:
        rendezvous = open_store(Path(order.directory), group_order.world_size, RENDEZVOUS_TIMEOUT_S, secret)
    rendezvous.set(ready_key(rank), "1")  # rank 0 joins once every rank is here (Ranks.wait_until_ready)
    seat = RankSeat(rank, group_order.world_size, group_order.device_type, local_rank=rank % spec.resources.processes)
    group = RankGroup.join(rendezvous, seat, secret, seed=spec.seed, sharded=spec.resources.strategy == "fsdp")
    target = CheckpointTarget(store, JobPaths(group_order.job_id), group_order.attempt, spec.checkpoint.keep_last,
                              log=control.log, min_interval_s=spec.checkpoint.min_interval_s)
    finished = False
    try:
        plan = RankPlan(spec, group_order.allowed_prefixes, group_order.cpu_threads, target, state, group_order.pause_at)
        run(assemble(plan, layout_for(group, spec.resources.strategy, spec.loop.precision), control))
        finished = True
    except BaseException as exc:  # noqa: BLE001 - a BaseException from the job's code is its failure too
        report(exc)
        raise
    finally:
        if finished:  # a failing rank leaves at once (``main``): tearing the group down under a collective a
            group.close()  # background thread may still be in (a checkpoint's) aborts the process instead


def _resume_state(order: GroupOrder, store) -> Optional[dict]:
    """The state this rank resumes from: the sharded checkpoint's directory rank 0's node downloaded and
    verified, or the checkpoint read and verified here; None from the start."""
    from baton.storage.checkpoint_io import load_bytes
    from baton.storage.checkpoint_io import SHARDS_KEY

    if order.resume_dir:
        return {SHARDS_KEY: order.resume_dir}
    if order.resume_key:
        return load_bytes(store.get_bytes(order.resume_key), order.resume_sha256, where=order.resume_key)
    return None


def main() -> int:
    raw = json.loads(os.environ[ARGS_ENV])
    return serve(raw, os.environ.pop(SECRET_ENV))  # the secret: not inherited by what the job's code starts


def serve(raw: dict, secret: str) -> int:
    """This rank's whole life, given its place (``RankOrder``'s fields) and the attempt's secret: its exit
    status. A new interpreter (``main``), a spare forked ahead of the attempt (``spare_ranks``) or a follower's
    forkserver's child (``forked_ranks``) runs it."""
    # a Ctrl-C reaches every rank of the terminal's process group: rank 0 decides what it means, so until
    # RankControl takes it, it must not become a KeyboardInterrupt here (that would read as the job's failure)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(raw["parent_pid"])
    report = FailureReporter(Path(raw["directory"]), raw["rank"])
    try:
        run_rank(_order(raw), secret, report)
    except BaseException as exc:  # as on rank 0: anything from the job's code (or spec) fails the job
        if report(exc):
            return EXIT_USER_CODE
        traceback.print_exc()  # storage or the group failed here: rank 0 counts this rank lost
        return 1
    return 0


def _order(raw: dict) -> RankOrder:
    """This rank's order; a spec this rank cannot take (a node whose baton reads it otherwise) is a
    SpecError naming each wrong field: the job's failure, as on rank 0."""
    from baton.schemas.spec import JobSpec

    JobSpec.parse(raw["group"]["spec"])
    return RankOrder.model_validate(raw)


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown: the rank's work is done or reported, and C++ threads a
    collective left running (gloo's, a checkpoint's) abort the process when destroyed under it
    ("terminate called without an active exception"), which would hide its exit status."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
