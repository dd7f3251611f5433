"""A stand-in for a worker that forks a rank from its forkserver, as a multi-node follower does
(``baton.workers.parallel.forked_ranks``), for tests/workers/parallel/test_forked_ranks.py:
``python -m tests.workers.parallel.forked_rank_probe TARGET FOLDER``. It forks ``TARGET`` of this module,
prints ``pid N`` and then obeys its stdin: ``stop`` (send the rank one SIGTERM, print ``sent``),
``children`` (print how many of multiprocessing's children it has), ``wait`` (wait for the rank's end,
print ``exit CODE``). The rank writes its lines to the FIFO ``FOLDER/rank``. Its forkserver imports this
module first, so it ignores SIGTERM as a worker's does (``baton.workers.attempt.preload``), and so do
the ranks it forks until they take it."""
from __future__ import annotations

import multiprocessing
import os
import select
import signal
import sys
import time
from pathlib import Path

from baton.workers.parallel import forked_ranks

signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _say(folder: str):
    out = open(Path(folder) / "rank", "w", buffering=1)  # (blocks until the test has opened it)
    return lambda line: print(line, file=out, flush=True)


def hold_the_gil(folder: str, worker) -> None:
    """Arm the death watch, say so, then stay in one C call that never lets another thread run."""
    forked_ranks.die_with_worker(worker)
    say = _say(folder)  # (kept open: its close would read as the rank's end)
    say("armed")
    sum(range(10 ** 14))


def stop_late(folder: str, worker) -> None:
    """Arm the death watch, say so, wait (ignoring SIGTERM, as a rank before its handlers) until the test
    writes to the FIFO FOLDER/go, then take SIGTERM: once one comes, say ``stopped N`` (the SIGTERMs that
    came within 0.5 s) and exit 0."""
    forked_ranks.die_with_worker(worker)
    go = os.open(Path(folder) / "go", os.O_RDONLY | os.O_NONBLOCK)  # (a reader from here on)
    say = _say(folder)
    say("forked")
    select.select([go], [], [])
    stops: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stops.append(signum))
    while not stops:
        time.sleep(0.01)
    time.sleep(0.5)
    say(f"stopped {len(stops)}")
    os._exit(0)


def main() -> None:
    target, folder = sys.argv[1:]
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(["tests.workers.parallel.forked_rank_probe"])
    from tests.workers.parallel import forked_rank_probe  # (by its own name: the forkserver unpickles it so)

    rank = forked_ranks.fork(forkserver, getattr(forked_rank_probe, target), folder)
    print(f"pid {rank.pid}", flush=True)
    for line in sys.stdin:
        if line.strip() == "stop":
            rank.send_signal(signal.SIGTERM)
            print("sent", flush=True)
        elif line.strip() == "children":  # (what multiprocessing polls at every start of a process)
            print(f"children {len(multiprocessing.active_children())}", flush=True)
        elif line.strip() == "wait":
            print(f"exit {rank.wait(timeout=20)}", flush=True)


if __name__ == "__main__":
    main()
