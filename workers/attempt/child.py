"""The training process of a worker's attempt (``process.py`` forks it; ``channel`` connects it).

It runs the attempt as ``baton run`` would (``session.run_attempt``), with the worker's side reached
through the channel: the fence before every commit, progress and commits for the job's record, and
for a multi-node job's leader, its peers' calls. It ignores SIGINT and SIGTERM (a Ctrl-C reaches the whole process group;
the worker decides what a signal means and says so through the stop flag), and is SIGKILLed by the
kernel if its parent, the forkserver, ends (which it does when the worker does).

Its last message (``AttemptEnd``) says how the attempt ended: the outcome, or the failure, classified
here, where the exception is (``ENDINGS``; anything else is ``failed``: the job's own code or spec,
with its summary and traceback, computed here, where the user's modules are loaded).
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
from multiprocessing.connection import Connection
from typing import Optional

from baton.workers.training.failures import failure, summary
from baton.storage.checkpointing import writer_start
from baton.storage.redaction import RedactingFilter, Redactor
from baton.schemas.errors import CheckpointWriteFailed, FencedOut, TransientError, formatted_traceback
from baton.schemas.messages import AttemptEnd, AttemptOrder, Ending, Failure
from baton.storage.stores.open import open_store
from baton.workers.parallel.errors import NodeReleased, RankLost
from baton.workers.parallel import spare_ranks
from baton.workers.parallel.job_identity import become
from baton.workers.parallel.launcher import die_with_parent

from baton.workers.attempt.channel import Remote, RemoteControl, StopFlag
from baton.workers.attempt.process_tree import kill_descendants
from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt
from baton.workers.parallel.nodes import peers_for

ENDINGS = ((FencedOut, Ending.FENCED), (TransientError, Ending.STORAGE), (NodeReleased, Ending.NODE_RELEASED),
           (RankLost, Ending.RANK_LOST), (CheckpointWriteFailed, Ending.CHECKPOINT_WRITE))
"""The exceptions that end an attempt without being the job's fault, and what each is (anything else
from the attempt is the job's own failure)."""


def main(conn: Connection, stop: StopFlag, order: AttemptOrder) -> None:
    become(order.identity)  # first: the job's user, for this process and all it starts (job_identity)
    die_with_parent(os.getppid())
    # a forkserver's child inherits "forkserver" as its default start method: the job's DataLoader workers
    # must start as in any other process (forked from this one, its logging and data set included)
    multiprocessing.set_start_method(None, force=True)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    # first, while this process has no thread and torch imported: the ranks 1..N-1 this node's attempt will
    # start, then the checkpoint writer (so that no rank inherits this process's spare writer)
    spare_ranks.fork(order.spec.resources.processes - 1)
    writer_start.fork_spare()
    _log_to_stderr()
    remote = Remote(conn)
    control = RemoteControl(remote, stop, order.job_id)
    sys.path[:0] = order.import_path  # the job's shipped code: before anything installed (this process is its alone)
    store = open_store(order.store_gate or order.storage_url)  # a worker's: its gate, this job's objects only
    attempt = Attempt(order.spec, order.job_id, order.attempt, store, order.allowed_prefixes,
                      order.claim, order.import_path, order.pause_at)
    options = AttemptOptions(control, fence=control.fence, on_commit=control.on_commit, worker=order.worker,
                             job_log=True, memory=order.memory, peers=peers_for(order.peers, remote.call),
                             setup_log=order.setup_log)
    try:
        result = run_attempt(attempt, options)
    except BaseException as exc:  # noqa: BLE001 - every failure is the worker's to record: this process ignores
        # SIGINT and SIGTERM, so a KeyboardInterrupt, a SystemExit or an asyncio.CancelledError here is the job's
        # own code's (unreported, it would look like this process's crash: a loss, retried)
        remote.end(AttemptEnd(failure=describe_failure(exc, order.allowed_prefixes, control.step_now,
                                                       f"`baton logs {order.job_id}`")))
    else:
        remote.end(AttemptEnd(outcome=result.outcome, resumed_from_step=result.resumed_from_step))
    leave()


def _log_to_stderr() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RedactingFilter(Redactor()))
    handler.setFormatter(logging.Formatter(f"[training pid {os.getpid()}] %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)


def leave() -> None:
    """Exit now that the worker knows how the attempt ended: a thread left running by the job's code
    (not a daemon) must not keep this process, and the worker waiting for it, alive; a DataLoader
    worker of a failed attempt goes too."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    kill_descendants()
    os._exit(0)


def describe_failure(exc: BaseException, allowed_prefixes: tuple[str, ...], step: Optional[int] = None,
                     full_traceback_at: str = "the job's log") -> Failure:
    for kind, ending in ENDINGS:
        if isinstance(exc, kind):
            return Failure(ending=ending, message=str(exc), type=type(exc).__name__, step=step)
    return Failure(ending=Ending.FAILED, message=str(exc), type=type(exc).__name__, step=step,
                   summary=summary(exc, allowed_prefixes), traceback=formatted_traceback(exc),
                   shown=failure(exc, allowed_prefixes, full_traceback_at))
