"""The training process of a worker's attempt (``process.py`` forks it; ``channel`` connects it).

It runs the attempt as ``baton run`` would (``session.run_attempt``), with the worker's side reached
through the channel: the fence before every commit, progress and commits for the job's record, a
multi-node gang's start. It ignores SIGINT and SIGTERM (a Ctrl-C reaches the whole process group;
the worker decides what a signal means and says so through the stop flag), and is SIGKILLed by the
kernel if its parent, the forkserver, ends (which it does when the worker does).

Its last message says how the attempt ended: the outcome, or the error, classified here, where the
exception is (the worker records it): ``fenced``, ``transient`` (storage), ``node_released``,
``rank_lost``, ``checkpoint_write``, or ``failed`` (the job's own code or spec: its summary and
traceback, computed here, where the user's modules are loaded).
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
from multiprocessing.connection import Connection

from baton.workers.training.failures import summary
from baton.storage.redaction import RedactingFilter, Redactor
from baton.schemas.errors import CheckpointWriteFailed, FencedOut, TransientError, formatted_traceback
from baton.schemas.spec import JobSpec
from baton.storage.stores.open import open_store
from baton.workers.parallel.errors import NodeReleased, RankLost
from baton.workers.parallel.launcher import die_with_parent

from baton.workers.attempt.channel import Remote, RemoteControl, RemoteGang, StopFlag
from baton.workers.attempt.process_tree import kill_descendants
from baton.workers.attempt.session import run_attempt

INFRASTRUCTURE = ((FencedOut, "fenced"), (TransientError, "transient"), (NodeReleased, "node_released"),
                  (RankLost, "rank_lost"), (CheckpointWriteFailed, "checkpoint_write"))


def main(conn: Connection, stop: StopFlag, args: dict) -> None:
    die_with_parent(os.getppid())
    # a forkserver's child inherits "forkserver" as its default start method: the job's DataLoader workers
    # must start as in any other process (forked from this one, its logging and data set included)
    multiprocessing.set_start_method(None, force=True)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RedactingFilter(Redactor()))
    handler.setFormatter(logging.Formatter(f"[training pid {os.getpid()}] %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    remote = Remote(conn)
    control = RemoteControl(remote, stop, args["job_id"])
    gang = args.get("gang")
    allowed = tuple(args["allowed_prefixes"])
    try:
        result = run_attempt(JobSpec.parse(args["spec"]), args["job_id"], open_store(args["storage_url"]),
                             args["attempt"], control, claim=args["claim"], allowed_prefixes=allowed,
                             fence=control.fence, on_commit=control.on_commit, worker=args["worker"], job_log=True,
                             gang=RemoteGang(remote, **gang) if gang else None, memory=args.get("memory"))
    except BaseException as exc:  # noqa: BLE001 - every failure is the worker's to record: this process ignores
        # SIGINT and SIGTERM, so a KeyboardInterrupt, a SystemExit or an asyncio.CancelledError here is the job's
        # own code's (unreported, it would look like this process's crash: a loss, retried)
        remote.end({**describe_failure(exc, allowed), "step": control.step_now})
    else:
        outcome = result.outcome
        remote.end({"outcome": {"completed": outcome.completed, "reason": outcome.reason, "step": outcome.step},
                    "resumed_from_step": result.resumed_from_step})
    leave()


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


def describe_failure(exc: BaseException, allowed_prefixes: tuple[str, ...]) -> dict:
    for kind, name in INFRASTRUCTURE:
        if isinstance(exc, kind):
            return {"error": name, "message": str(exc), "type": type(exc).__name__}
    return {"error": "failed", "message": str(exc), "type": type(exc).__name__,
            "summary": summary(exc, allowed_prefixes), "traceback": formatted_traceback(exc)}
