"""A rank forked from its worker's forkserver (``forked_ranks``), through a stand-in worker
(``forked_rank_probe``) and a real forkserver: the rank dies within moments of its worker's SIGKILL even
while it holds the GIL in one C call (the kernel kills it, no thread of its own has to run), and is not
among multiprocessing's children there (whose polling at every start would race its owner's); a SIGTERM
sent while the rank still ignores it (between its fork and its handlers) reaches its handler once it is
in, once. The whole path, a multi-node follower's ranks dying with their SIGKILLed worker:
tests/workers/parallel/test_multinode.py."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, baton_env

WAIT_S = 20.0  # a bound for a hang (each wait here is a fraction of a second)


class Stand:
    """The stand-in worker: its stdin and stdout, and the rank's lines (the FIFO ``rank``)."""

    def __init__(self, folder):
        self.folder = folder
        self.proc: subprocess.Popen | None = None
        self.pidfd: int | None = None
        self._rank_out: int | None = None
        self._buffer = b""

    def start(self, target: str) -> None:
        os.mkfifo(self.folder / "rank")
        self._rank_out = os.open(self.folder / "rank", os.O_RDONLY | os.O_NONBLOCK)
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.workers.parallel.forked_rank_probe", target,
                                      str(self.folder)], cwd=REPO, env=baton_env(), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("pid "), line
        self.rank = int(line.split()[1])

    def ask(self, command: str) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline()

    def rank_says(self) -> str:
        deadline = time.monotonic() + WAIT_S
        while b"\n" not in self._buffer:
            assert select.select([self._rank_out], [], [], max(0.0, deadline - time.monotonic()))[0], "no line"
            chunk = os.read(self._rank_out, 4096)
            assert chunk, f"the rank closed its end; it said {self._buffer!r}"
            self._buffer += chunk
        if self.pidfd is None:  # (it has spoken, so its pid is its own still)
            self.pidfd = os.pidfd_open(self.rank)
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def rank_ended(self, within_s: float) -> bool:
        return bool(select.select([self.pidfd], [], [], within_s)[0])

    def close(self) -> None:
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)  # a rank left would spin a core for ever
            except ProcessLookupError:  # (it has ended)
                pass
            os.close(self.pidfd)
        if self._rank_out is not None:
            os.close(self._rank_out)
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def stand_in(tmp_path):
    stands: list[Stand] = []

    def start(target: str) -> Stand:
        stands.append(Stand(tmp_path))
        stands[-1].start(target)
        return stands[-1]

    yield start
    for stand in stands:
        stand.close()


def test_a_rank_holding_the_gil_dies_with_its_sigkilled_worker(stand_in):
    stand = stand_in("hold_the_gil")
    assert stand.rank_says() == "armed"
    # its status is read by its owner alone, not by every start of another process (multiprocessing's
    # active_children, which would race that read)
    assert stand.ask("children") == "children 0\n"
    assert not stand.rank_ended(0.5)  # alive while its worker is
    stand.proc.kill()
    assert stand.rank_ended(WAIT_S), "the rank outlived its SIGKILLed worker"


def test_a_sigterm_sent_before_the_rank_takes_it_reaches_it_once_it_does(stand_in, tmp_path):
    os.mkfifo(tmp_path / "go")
    stand = stand_in("stop_late")
    assert stand.rank_says() == "forked"  # the rank ignores SIGTERM from its fork...
    assert stand.ask("stop") == "sent\n"
    assert not stand.rank_ended(0.3)
    go = os.open(tmp_path / "go", os.O_WRONLY | os.O_NONBLOCK)  # ...until its handler is in
    os.write(go, b"go")
    os.close(go)
    assert stand.rank_says() == "stopped 1"  # once: the job's code may take a second one as "quit now"
    assert stand.ask("wait") == "exit 0\n"
