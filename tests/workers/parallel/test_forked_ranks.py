"""A rank forked from its worker's forkserver (``forked_ranks``), through a stand-in worker
(``forked_rank_probe``) and a real forkserver: the rank dies within moments of its worker's SIGKILL even
while it holds the GIL in one C call (the kernel kills it, no thread of its own has to run), and is not
among multiprocessing's children there (whose polling at every start would race its owner's); a SIGTERM
sent while the rank still ignores it (between its fork and its handlers) still reaches its handlers.
The whole path, a multi-node follower's ranks dying with their SIGKILLed worker:
tests/workers/parallel/test_multinode.py."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

import pytest

from tests.helpers import REPO, baton_env

WAIT_S = 20.0  # a bound for a hang (either way it is a fraction of a second here)


@pytest.fixture
def stand_in(tmp_path):
    started: list[subprocess.Popen] = []
    ranks: list[int] = []

    def start(target: str) -> tuple[subprocess.Popen, int]:
        proc = subprocess.Popen([sys.executable, "-m", "tests.workers.parallel.forked_rank_probe", target,
                                 str(tmp_path)], cwd=REPO, env=baton_env(), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        started.append(proc)
        line = proc.stdout.readline()
        assert line.startswith("pid "), line
        ranks.append(int(line.split()[1]))
        return proc, ranks[-1]

    yield start
    for pid in ranks:  # a rank that outlived its stand-in would spin a core for ever
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for proc in started:
        proc.kill()
        proc.wait()


def _ended_within(pidfd: int, seconds: float) -> bool:
    return bool(select.select([pidfd], [], [], seconds)[0])


def test_a_rank_holding_the_gil_dies_with_its_sigkilled_worker(stand_in):
    worker, rank = stand_in("hold_the_gil")
    assert worker.stdout.readline() == "armed\n"  # (printed by the rank: it shares the forkserver's stdout)
    pidfd = os.pidfd_open(rank)
    try:
        worker.stdin.write("children\n")  # its status is read by the rank's owner alone, not by every start
        worker.stdin.flush()  # of another process (multiprocessing's active_children, which would race it)
        assert worker.stdout.readline() == "children 0\n"
        assert not _ended_within(pidfd, 0.5)  # alive while its worker is
        worker.kill()
        assert _ended_within(pidfd, WAIT_S), "the rank outlived its SIGKILLed worker"
    finally:
        os.close(pidfd)


def test_a_sigterm_sent_before_the_rank_takes_it_still_stops_it(stand_in, tmp_path):
    os.mkfifo(tmp_path / "go")
    worker, rank = stand_in("stop_late")
    assert worker.stdout.readline() == "forked\n"  # the rank ignores SIGTERM from here on...
    worker.stdin.write("stop\n")
    worker.stdin.flush()
    assert worker.stdout.readline() == "sent\n"
    with open(tmp_path / "go", "wb"):  # ...until its handler is in
        pass
    assert worker.stdout.readline() == "handler\n"
    worker.stdin.write("wait\n")
    worker.stdin.flush()
    assert worker.stdout.readline() == "stopped\n"
    assert worker.stdout.readline() == "exit 0\n"
