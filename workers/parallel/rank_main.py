"""A rank 1..N-1 of a data-parallel attempt (started by ``baton.workers.parallel.launcher``; rank 0 is its parent).

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

from baton.workers.parallel import failure_report
from baton.workers.parallel.failure_report import EXIT_USER_CODE
from baton.workers.parallel.launcher import ARGS_ENV, RENDEZVOUS_TIMEOUT_S, die_with_parent, ready_key
from baton.workers.parallel.rendezvous import SECRET_ENV, connect_tcp, open_store


class RankControl:
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


def run_rank(args: dict, secret: str, report: Callable[[BaseException], bool] = lambda exc: False) -> None:
    """This rank's share of the attempt; a failure of the job's code is passed to ``report`` while
    this rank is still in the group (the others learn of it when its connections close)."""
    from baton.schemas.spec import JobSpec
    from baton.storage.checkpoint_io import load_bytes
    from baton.storage.layout import JobPaths
    from baton.storage.stores.open import open_store as open_object_store
    from baton.workers.training import rng, train_state
    from baton.workers.training.components import build_components
    from baton.workers.training.determinism import configure, prepare_process
    from baton.workers.training.loop import TrainingLoop

    from baton.workers.parallel import sharded_state
    from baton.workers.parallel.distributed import RankGroup
    from baton.workers.parallel.sharded_checkpoint import ShardedCheckpointer

    prepare_process()
    rank, world_size = args["rank"], args["world_size"]
    control = RankControl(rank)
    spec = JobSpec.parse(args["spec"])
    state = None
    shards = Path(args["resume_dir"]) if args.get("resume_dir") else None  # sharded: downloaded, verified by rank 0
    if args.get("resume_key"):
        store = open_object_store(args["storage_url"])
        state = load_bytes(store.get_bytes(args["resume_key"]), args["resume_sha256"], where=args["resume_key"])
    configure(spec.loop.deterministic, args["cpu_threads"])
    if args.get("endpoint"):  # a multi-node attempt: its leader's TCP store
        rendezvous = connect_tcp(args["endpoint"], RENDEZVOUS_TIMEOUT_S, secret)
    else:
        rendezvous = open_store(Path(args["directory"]), world_size, RENDEZVOUS_TIMEOUT_S, secret)
    rendezvous.set(ready_key(rank), "1")  # rank 0 joins once every rank is here (Ranks.wait_until_ready)
    group = RankGroup.join(rendezvous, rank, world_size, args["device_type"], spec.seed, secret,
                           strategy=spec.resources.strategy, precision=spec.loop.precision,
                           local_rank=rank % spec.resources.processes)
    checkpointer = None
    finished = False
    try:
        rng.seed_all(spec.seed)
        parts = group.adopt(build_components(spec, group.device, tuple(args["allowed_prefixes"]), rank, world_size,
                                             prepare_model=group.prepare_model))
        paths = JobPaths(args["job_id"]).for_attempt(args["attempt"])
        loop = TrainingLoop(parts, None, group.control(control), args["cpu_threads"], group=group)
        if group.sharded:  # this rank writes its own shard; rank 0 commits
            checkpointer = ShardedCheckpointer(group, parts, open_object_store(args["storage_url"]), JobPaths(args["job_id"]),
                                               args["attempt"], spec.checkpoint.keep_last, log=control.log)
            loop.checkpointer = checkpointer
        else:
            loop.checkpointer = group.checkpointer(None, parts, paths, lambda: loop.progress)
        if shards is not None:
            loop.progress, loop.best, loop.metrics = sharded_state.restore(parts, shards, rank, world_size,
                                                                           group.checkpoint_group)
        elif state is not None:
            loop.progress, loop.best, loop.metrics = train_state.restore(parts, state)
            loop.progress = group.restore(parts, state)
        loop.run()
        if checkpointer is not None:
            checkpointer.close()
            checkpointer = None
        control.log(loop.checkpointer.describe())
        finished = True
    except BaseException as exc:  # noqa: BLE001 - a BaseException from the job's code is its failure too
        report(exc)
        raise
    finally:
        if checkpointer is not None:
            checkpointer.abandon()
        if finished:  # a failing rank leaves at once (``main``): tearing the group down under a collective a
            group.close()  # background thread may still be in (a checkpoint's) aborts the process instead


def main() -> int:
    # a Ctrl-C reaches every rank of the terminal's process group: rank 0 decides what it means, so until
    # RankControl takes it, it must not become a KeyboardInterrupt here (that would read as the job's failure)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    args = json.loads(os.environ[ARGS_ENV])
    secret = os.environ.pop(SECRET_ENV)  # not inherited by what the job's code starts
    die_with_parent(args["parent_pid"])
    report = FailureReporter(Path(args["directory"]), args["rank"])
    try:
        run_rank(args, secret, report)
    except BaseException as exc:  # as on rank 0: anything from the job's code (or spec) fails the job
        if report(exc):
            return EXIT_USER_CODE
        traceback.print_exc()  # storage or the group failed here: rank 0 counts this rank lost
        return 1
    return 0


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
