"""An attempt in a training process of its own, and how the worker (its agent) sees it end.

The worker process holds the job's lease, its records and its signals; the loop runs in a child
(``start``), so that the worker outlives it: when the child dies (SIGKILL, the OOM killer, a segfault
in an extension) the worker knows at once, from the child's exit, not from a heartbeat, and can
bring the job back on this machine from the state the child last copied into memory
(``baton.storage.memory.memory_copy``). What the child asks of the worker travels through ``channel``.

Children are forked from multiprocessing's *forkserver*: a process started once per worker, which
imports torch and baton's training code and runs one tiny training step (``warm``) before it forks
anything, so that a training process starts in milliseconds, not the seconds those imports take.
The forkserver leaves torch's intra-op pool unstarted (one thread) and initialises no CUDA, so forking
from it is safe; each child sets its own thread count. A child whose pipe to the worker closes ends
at once (``channel``): that is how a training process never outlives its worker. (It also asks the
kernel for SIGKILL when the forkserver ends, ``PR_SET_PDEATHSIG``; the forkserver ignores SIGTERM,
which is the worker's to act on, and ends when the worker does, once its children are gone.)
The worker is the subreaper of what its training processes leave (``reap_orphans``). The forkserver
starts with the job's environment, not the worker's: without the pool's credentials (``job_env``).

``Ended`` says how: the attempt's own end (``result``: an outcome, or an error reported by the
child: the job's code failed, storage went away...), or the process's death without one
(``death``: a signal, or an exit status, and whether the kernel's OOM killer did it).
"""
from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.util
import os
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Optional

from baton.schemas.messages import AttemptEnd, AttemptOrder, Ending, Failure
from baton.storage.processes import own_cgroup

from baton.workers.attempt import wire
from baton.workers.attempt.channel import StopFlag, serve
from baton.workers.attempt.job_env import spawn_with_job_environment
from baton.workers.attempt.process_tree import kill_descendants, parents

_log = logging.getLogger("baton.worker")

POLL_S = 0.02
"""How often the worker refreshes the stop flag while it waits for the child."""
_context: Optional[Any] = None


def context():
    """This process's forkserver context, its preloads set (the server starts with the first child)."""
    global _context
    if _context is None:
        # the forkserver, and so every training process, starts without the pool's credentials (``job_env``)
        multiprocessing.util.spawnv_passfds = spawn_with_job_environment  # type: ignore[attr-defined]
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(["baton.workers.attempt.preload"])
    return _context


def start_forkserver() -> float:
    """Start the forkserver and wait for its imports and warm-up (a worker does this before it takes
    jobs, so that no job's start or recovery pays for it); the seconds it took. Where
    ``warm_forkserver_early`` started it, wait for that instead."""
    return _early.result() if _early is not None else _start_now()  # (its error, if any, raised here)


class ForkserverBroken(RuntimeError):
    """A process forked from the forkserver cannot import the training code (a broken torch install, a
    missing library): every training process would die the same way."""


def _start_now() -> float:
    started = time.monotonic()
    probe = context().Process(target=_import_the_loop, name="baton-forkserver-probe")
    probe.start()
    probe.join()
    if probe.exitcode != 0:  # multiprocessing's forkserver skips a preload that fails to import: ask a child
        raise ForkserverBroken(f"a training process could not import baton's training code (exit {probe.exitcode}; "
                               "its traceback is above in this log)")
    return time.monotonic() - started


_early: Optional[Future] = None


def warm_forkserver_early() -> None:
    """Start the forkserver now, in a thread, while the worker's broker connection and the rest of its
    start-up go on (its torch import takes seconds either way); ``start_forkserver`` waits for it."""
    global _early
    if _early is None:
        _early = ThreadPoolExecutor(max_workers=1, thread_name_prefix="baton-forkserver-start").submit(_start_now)


def _import_the_loop() -> None:
    """What every training process imports: already in the forkserver (instant) when its preload worked."""
    import baton.workers.attempt.child  # noqa: F401


@dataclass(frozen=True)
class Death:
    """The training process ended without saying how its attempt ended."""

    pid: int
    exitcode: int  # negative: killed by that signal
    oom: bool  # the kernel's OOM killer killed a process of this worker's cgroup meanwhile
    at: float  # time.monotonic() when the worker saw it

    def describe(self) -> str:
        if self.exitcode < 0:
            how = f"was killed by {self.signal_name}" + (" (the kernel's OOM killer)" if self.oom else "")
        else:
            how = f"exited with status {self.exitcode} without ending its attempt"
        return f"the training process (pid {self.pid}) {how}"

    @property
    def signal_name(self) -> str:
        """``SIGKILL``, or ``exit N`` when no signal killed it."""
        if self.exitcode >= 0:
            return f"exit {self.exitcode}"
        return signal.Signals(-self.exitcode).name if -self.exitcode in signal.valid_signals() else f"signal {-self.exitcode}"


@dataclass(frozen=True)
class Ended:
    result: Optional[AttemptEnd] = None  # the child's ``end`` message
    death: Optional[Death] = None


END_WAIT_S = 10.0
"""How long a training process may take to exit after its last message, before it is killed."""
STACKS_WAIT_S = 2.0
"""How long a hung training process may take to send its threads' stacks."""


class TrainingProcess:
    """One attempt's child: started with its arguments, served until it ends."""

    def __init__(self, order: AttemptOrder):
        ctx = context()
        self._conn, child_conn = ctx.Pipe()
        self._send_lock = threading.Lock()
        self._stacks: Optional[str] = None
        self._stacks_came = threading.Event()
        self.killed_for: Optional[str] = None  # why the worker killed it (a hang), if it did
        self.reported_end = False  # it sent how its attempt ended
        self.stop = StopFlag(ctx.RawValue("b", 0))
        self._oom_before = oom_kills()
        become_subreaper()
        self.process = ctx.Process(target=_child_main, args=(child_conn, self.stop.raw, order),
                                   name=f"baton-train-{order.job_id}", daemon=False)
        self.process.start()
        child_conn.close()
        self.pid = self.process.pid

    def serve(self, handlers: dict[str, Callable[..., Any]], stop_reason: Callable[[], tuple[Optional[str], bool]]) -> Ended:
        """Answer the child's messages until it ends; ``stop_reason()`` is copied into its stop flag."""
        result, ended_at = None, 0.0
        while True:
            self.stop.set(*stop_reason())
            ready = wait([self._conn, self.process.sentinel], timeout=POLL_S)
            if result is not None and not ready and time.monotonic() - ended_at > END_WAIT_S:
                self.kill("lingered")  # it said how its attempt ended, but does not exit
            if self._conn in ready:
                try:
                    message = wire.receive(self._conn)
                except wire.Refused as exc:  # the job's code wrote into the pipe: nothing it says is believed now
                    return self._refused(exc)
                if message is not None:
                    if message[0] == "end":
                        result, ended_at = message[2], time.monotonic()
                        self.reported_end = True
                    elif message[0] == "stacks":
                        self._stacks = message[2]
                        self._stacks_came.set()
                    else:
                        serve(message, handlers, self._send)
                    continue
            if self.process.sentinel in ready or self._conn in ready:  # gone: what it sent before is read above
                self.process.join()
                seen = time.monotonic()
                if result is not None and self.process.exitcode == 0:
                    return Ended(result=result)
                oom = oom_kills() > self._oom_before
                return Ended(result=result, death=Death(self.pid, self.process.exitcode, oom, seen))

    def _refused(self, why: wire.Refused) -> Ended:
        """The child sent what it may not (its job's code wrote into the channel): killed, and the attempt
        ended as the job's failure (a wrong message is its code's, and would come again on a retry)."""
        _log.error("training process %d sent its worker a message it may not send: %s; it is killed", self.pid, why)
        self.kill("broke the channel's protocol")
        self.process.join()
        self.reported_end = True
        return Ended(result=AttemptEnd(failure=Failure(
            ending=Ending.FAILED, type="ChannelRefused",
            message=f"the training process sent its worker a message it may not send ({why}): the job's code wrote into "
                    "baton's channel, and the attempt was ended")))

    def _send(self, message: tuple) -> None:
        with self._send_lock:
            self._conn.send(message)

    def stacks(self) -> str:
        """Every thread's stack in the child, as it sends them (from a thread of its own, so a main
        thread stuck anywhere but in code that holds the GIL does not stop it)."""
        self._stacks_came.clear()
        try:
            self._send(("stacks", 0, None))
        except OSError:
            return "(the training process is gone)"
        if not self._stacks_came.wait(STACKS_WAIT_S):
            return f"(the training process sent no stacks within {STACKS_WAIT_S:.0f}s: a thread holds the GIL)"
        return self._stacks or ""

    def close(self) -> None:
        """After the child ended (any way): its orphans (processes it left, which the kernel handed to
        this subreaper) killed and reaped; the pipe closed."""
        if self.process.is_alive():
            self.kill("its worker is done with it")
        self.process.join()
        reap_orphans()
        self._conn.close()

    def kill(self, why: str) -> None:
        """SIGKILL the child and every process below it (a DataLoader worker hung in the data set's code
        would never look at its parent again): frozen first, so none forks meanwhile."""
        self.killed_for = why
        try:
            os.kill(self.pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        kill_descendants(self.pid)
        os.kill(self.pid, signal.SIGKILL)


def _child_main(conn: Connection, stop_raw, order: AttemptOrder) -> None:
    from baton.workers.attempt.child import main

    main(conn, StopFlag(stop_raw), order)


def become_subreaper() -> None:
    """Orphans of this process's descendants become its children (``PR_SET_CHILD_SUBREAPER``), not
    init's: what a dead training process leaves (a DataLoader worker stuck in the data set's code)
    can then be found and ended (``reap_orphans``). Linux only; elsewhere nothing is done."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def reap_orphans() -> set[int]:
    """Kill and reap this process's children that multiprocessing does not manage (the forkserver and
    the training processes are its): orphans handed to this subreaper, with everything below them."""
    from multiprocessing import forkserver

    managed = {getattr(forkserver._forkserver, "_forkserver_pid", None)}
    orphans = {pid for pid, parent in parents().items() if parent == os.getpid()} - managed
    orphans -= {child.pid for child in multiprocessing.active_children()}
    for pid in orphans:
        kill_descendants(pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in orphans:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    return orphans


def oom_kills() -> int:
    """The OOM killer's kills in this process's cgroup (cgroup v2's memory.events), 0 where unknown."""
    try:
        for entry in (own_cgroup() / "memory.events").read_text().splitlines():
            name, value = entry.split()
            if name == "oom_kill":
                return int(value)
    except (OSError, IndexError, ValueError):
        pass
    return 0
