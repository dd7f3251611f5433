"""A multi-node follower's ranks, forked from its worker's forkserver (``baton.workers.attempt.process``).

A follower's ranks are started by its worker's main process, which holds no torch: as new interpreters,
each would import torch and the training code again (seconds of a core per rank, at every gang the
worker joins). The worker's forkserver has imported both once, for its training processes, so a rank
forked from it starts in a fraction of a second.

Such a rank is the forkserver's child, in the worker's process group, and the forkserver outlives its
worker for as long as any child of its own lives (each holds its "alive" pipe), so neither the
forkserver's end nor its parent's death (``PR_SET_PDEATHSIG``, which covers only the forkserver's own
death) tells a rank that its worker is gone. The worker holds the one writing end of a pipe whose reading
end the rank holds, armed so that the kernel itself SIGKILLs the rank when the pipe closes (``O_ASYNC``
with ``F_SETSIG``), as when the worker dies, even by SIGKILL, and whatever the rank is doing (no thread
of its own has to run, so holding the GIL in an extension changes nothing).

Such a rank ignores SIGTERM from its fork (the forkserver does, ``preload``) until its own handlers take
it (``rank_main.RankControl``): a stop asked of it meanwhile is sent once they do (``ForkserverRank``).
"""
from __future__ import annotations

import fcntl
import multiprocessing
import multiprocessing.process
import os
import select
import signal
import subprocess
import threading
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Optional

from baton.schemas.messages import JobIdentity, RankOrder
from baton.storage.forked import name_process
from baton.workers.parallel.job_identity import become
from baton.workers.parallel.spare_ranks import RANK_NAME

STOPS = (signal.SIGTERM, signal.SIGINT)
LOOK_S = 0.05
"""How often a stop waiting for the rank's handlers looks whether they are in."""


class ForkserverRank:
    """A process forked by the forkserver, as much of ``subprocess.Popen`` as ``launcher.Ranks`` uses.

    It is signalled through a pidfd, so a signal never reaches another process that took its pid once
    the forkserver reaped it. Its exit status comes from the forkserver; if the forkserver itself died
    first, it reads as 255 (multiprocessing's), and the rank died with it (its ``PR_SET_PDEATHSIG``) or
    dies as that status closes the worker's end of its pipe (if the forkserver died before the rank
    asked for its parent-death signal). The
    status is read under a lock (the follower and the ranks' watchdog both look), and by nothing else:
    the process is not among multiprocessing's children, whose ``active_children()`` at every start of
    another process would read it concurrently. The worker's end of the rank's pipe is closed once the
    rank is known to have ended."""

    def __init__(self, process: multiprocessing.process.BaseProcess, worker_end: Connection):
        assert process.pid is not None  # (started)
        multiprocessing.process._children.discard(process)  # type: ignore[attr-defined]
        self.process, self.pid, self._worker_end = process, process.pid, worker_end
        self._pidfd: Optional[int] = os.pidfd_open(process.pid)
        self.returncode: Optional[int] = None
        self._lock = threading.Lock()
        self._stopping: set[int] = set()

    def poll(self) -> Optional[int]:
        with self._lock:
            if self.returncode is None:
                self.returncode = self.process.exitcode
                if self.returncode is not None and self._pidfd is not None:
                    self._worker_end.close()
                    os.close(self._pidfd)
                    self._pidfd = None
            return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        wait([self.process.sentinel], timeout)
        code = self.poll()
        if code is None:
            raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout or 0)
        return code

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` unless the rank has ended; a stop (SIGTERM, SIGINT) that the rank ignores (its
        handlers are not in yet) once it no longer does, exactly once (the job's code may read a second as
        "quit now")."""
        if signum not in STOPS or self._ignores(signum) is False:
            self._signal(signum)
            return
        with self._lock:
            if signum in self._stopping:
                return
            self._stopping.add(signum)
        threading.Thread(target=self._stop_when_taken, args=(signum,), name="baton-rank-stop", daemon=True).start()

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        with self._lock:
            if self._pidfd is not None:
                try:
                    signal.pidfd_send_signal(self._pidfd, signum)
                except ProcessLookupError:  # (it has ended: the forkserver reaped it)
                    pass

    def _ignores(self, signum: int) -> Optional[bool]:
        """Whether the rank ignores ``signum`` now (``/proc/PID/status``): False once it has ended, None
        where that cannot be read (no descriptor left, ``/proc`` hidden)."""
        try:
            with open(f"/proc/{self.pid}/status") as fh:
                ignored = next(int(line.split()[1], 16) for line in fh if line.startswith("SigIgn:"))
        except (FileNotFoundError, ProcessLookupError):
            return False
        except (OSError, StopIteration, ValueError):
            return None
        if self._ended():  # (what was read may be another process's, which took the rank's pid once it was reaped)
            return False
        return bool(ignored & (1 << (signum - 1)))

    def _ended(self) -> bool:
        """Whether the rank has exited (its pidfd is readable from its exit, before it is reaped)."""
        with self._lock:
            return self._pidfd is None or bool(select.select([self._pidfd], [], [], 0)[0])

    def _stop_when_taken(self, signum: int) -> None:
        """Send ``signum`` once the rank no longer ignores it; where that cannot be read, every ``LOOK_S``
        until it ends (then a handler may see more than one)."""
        while (ignores := self._ignores(signum)) is not False:
            if ignores is None:
                self._signal(signum)
            if wait([self.process.sentinel], LOOK_S):
                return
        self._signal(signum)


def starter(forkserver: Any) -> Callable[[RankOrder, str], ForkserverRank]:
    """What starts a rank (given its place and the attempt's secret) as a child of ``forkserver``, a
    multiprocessing context whose forkserver has imported the training code (the worker's). Where the
    forkserver cannot fork it (no descriptor or memory is left, it died during the request), ``start``
    raises OSError or EOFError. (A forkserver that died before is started again by multiprocessing, its
    imports paid then.)"""
    def start(place: RankOrder, secret: str) -> ForkserverRank:
        return fork(forkserver, _serve, place.model_dump(mode="json"), secret)

    return start


def fork(forkserver: Any, target: Callable[..., None], *args: Any) -> ForkserverRank:
    """``target(*args, worker)`` in a child of ``forkserver``: ``worker`` is the pipe the child must arm
    first (``die_with_worker``)."""
    rank_end, worker_end = forkserver.Pipe(duplex=False)
    process = forkserver.Process(target=target, args=(*args, rank_end), name=RANK_NAME,
                                 daemon=False)  # (its data loader may start processes)
    try:
        process.start()
    except BaseException:
        worker_end.close()
        raise
    finally:
        rank_end.close()
    try:
        return ForkserverRank(process, worker_end)
    except OSError:  # (no descriptor left for its pidfd): not left running, unwatched
        worker_end.close()  # the kernel kills it (or it kills itself as it arms its pipe: ``die_with_worker``)
        raise


def die_with_worker(worker: Connection) -> None:
    """Have the kernel SIGKILL this process when the worker's end of ``worker`` closes (nothing is ever
    sent on it); at once if it has closed already."""
    fd = worker.fileno()
    fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGKILL)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
    if select.select([fd], [], [], 0)[0]:  # closed before it was armed
        os.kill(os.getpid(), signal.SIGKILL)


def _serve(raw: dict, secret: str, worker: Connection) -> None:
    """The rank's life in the forked process: its parent is the forkserver, not the worker that asked."""
    identity = raw["group"].get("identity")
    become(JobIdentity.model_validate(identity) if identity else None)  # first: the job's user (job_identity)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (as ``rank_main.serve`` does; a KeyboardInterrupt here
    die_with_worker(worker)  # would end the rank with no report)
    from baton.workers.parallel import rank_main

    name_process(RANK_NAME)
    # a forkserver's child inherits "forkserver" as its default start method: the job's DataLoader workers
    # start as in any other process (forked from this one)
    multiprocessing.set_start_method(None, force=True)
    # its parent is the forkserver: PR_SET_PDEATHSIG covers the forkserver's death (the worker's: the pipe)
    rank_main.exit_now(rank_main.serve({**raw, "parent_pid": os.getppid()}, secret))
