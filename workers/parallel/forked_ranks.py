"""A multi-node follower's ranks, forked from its worker's forkserver (``baton.workers.attempt.process``).

A follower's ranks are started by its worker's main process, which holds no torch: as new interpreters,
each would import torch and the training code again (seconds of a core per rank, at every gang the
worker joins). The worker's forkserver has imported both once, for its training processes, so a rank
forked from it starts in a fraction of a second.

Such a rank is the forkserver's child, in the worker's process group, and the forkserver outlives its
worker for as long as any child of its own lives (each holds its "alive" pipe), so neither its parent's
death (``PR_SET_PDEATHSIG``, which the rank also asks for) nor the forkserver's end tells a rank that its
worker is gone. The worker tells it: a pipe whose one writing end the worker holds, watched by a thread
of the rank, which kills the rank (SIGKILL) when the pipe closes, as when the worker dies, even by SIGKILL.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import threading
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Optional

from baton.schemas.messages import RankOrder
from baton.storage.forked import name_process
from baton.workers.parallel.spare_ranks import RANK_NAME


class ForkserverRank:
    """A rank forked by the forkserver, as much of ``subprocess.Popen`` as ``launcher.Ranks`` uses. Its exit
    status comes through the forkserver, read once, under a lock (the follower and the ranks' watchdog
    both look); the worker's end of the rank's pipe is closed once it is known."""

    def __init__(self, process: multiprocessing.process.BaseProcess, worker_end: Connection):
        assert process.pid is not None  # (started)
        self.process, self.pid, self._worker_end = process, process.pid, worker_end
        self.returncode: Optional[int] = None
        self._lock = threading.Lock()

    def poll(self) -> Optional[int]:
        with self._lock:
            if self.returncode is None:
                self.returncode = self.process.exitcode
                if self.returncode is not None:
                    self._worker_end.close()
            return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        wait([self.process.sentinel], timeout)
        code = self.poll()
        if code is None:
            raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout or 0)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:  # (not reaped yet: the pid is still this rank's)
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def starter(forkserver: Any) -> Callable[[RankOrder, str], ForkserverRank]:
    """What starts a rank (given its place and the attempt's secret) as a child of ``forkserver``, a
    multiprocessing context whose forkserver has imported the training code (the worker's)."""
    def start(place: RankOrder, secret: str) -> ForkserverRank:
        rank_end, worker_end = forkserver.Pipe(duplex=False)
        process = forkserver.Process(target=_serve, args=(place.model_dump(mode="json"), secret, rank_end),
                                     name=RANK_NAME, daemon=False)  # (its data loader may start processes)
        try:
            process.start()
        finally:
            rank_end.close()
        return ForkserverRank(process, worker_end)

    return start


def _serve(raw: dict, secret: str, worker: Connection) -> None:
    """The rank's life in the forked process: its parent is the forkserver, not the worker that asked."""
    from baton.workers.parallel import rank_main

    name_process(RANK_NAME)
    threading.Thread(target=_die_with_worker, args=(worker,), name="baton-rank-worker-watch", daemon=True).start()
    # a forkserver's child inherits "forkserver" as its default start method: the job's DataLoader workers
    # start as in any other process (forked from this one)
    multiprocessing.set_start_method(None, force=True)
    rank_main.exit_now(rank_main.serve({**raw, "parent_pid": os.getppid()}, secret))


def _die_with_worker(worker: Connection) -> None:
    """Block until the worker's end of the pipe closes (nothing is ever sent), then kill this rank."""
    try:
        worker.recv_bytes()
    except (EOFError, OSError):
        pass
    os.kill(os.getpid(), signal.SIGKILL)
