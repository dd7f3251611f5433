"""Ranks 1..N-1 forked ahead of their attempt (``spare_ranks``): a 2-rank `baton run`'s rank 1 is a fork of
the run (named ``baton-rank``, no new interpreter) and trains; a spare dies with the process that forked
it when that one is SIGKILLed, even while another process holds its pipe open; one no attempt takes exits
at its closed pipe; a process that runs a thread forks none (its ranks start as new interpreters); a
forked child holds none of its parent's multiprocessing helpers. That forked ranks train bit for bit as
new interpreters do: tests/workers/parallel/test_ddp.py, whose resumed `baton run` (forked ranks) ends
equal to its in-process reference (ranks started as new interpreters); a worker's ranks are forked too:
tests/workers/parallel/test_ddp_workers.py."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from baton.storage.stores.file_store import FileStore

from tests.helpers import REPO, baton_env, make_spec, start_baton, wait_for, write_spec
from tests.workers.parallel.test_ddp import alive

HELD = make_spec(data={"target": "tests.probes:slow_spiral", "kwargs": {"n_per_class": 150, "delay_s": 0.001},
                       "batch_size": 16},
                 loop={"epochs": 2}, checkpoint={"every_steps": 4}, resources={"processes": 2})


def _comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as fh:
        return fh.read().strip()


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.slow
def test_a_two_rank_runs_rank_1_is_a_fork_of_the_run(tmp_path):
    hold = tmp_path / "hold"
    hold.touch()  # the ranks wait at their first sample while the file is there: rank 1 is looked at meanwhile
    spec = {**HELD, "data": {**HELD["data"], "kwargs": {**HELD["data"]["kwargs"], "hold": str(hold)}}}
    store = FileStore(tmp_path / "store")
    log = tmp_path / "run.log"
    run = start_baton("run", str(write_spec(tmp_path, spec)), "--id", "forked", "--storage", store.url, "--no-progress",
                      env=baton_env(), log=log)
    try:
        found = wait_for(lambda: re.search(r"ranks 1\.\.1 are pids (\d+)", log.read_text()), timeout=120,
                         what="rank 1's pid in the run's log")
        rank1 = int(found[1])
        assert _comm(rank1) == "baton-rank" and _ppid(rank1) == run.pid
        with open(f"/proc/{rank1}/cmdline", "rb") as fh:
            assert b"rank_main" not in fh.read()  # not a new interpreter
        hold.unlink()
        assert run.wait(timeout=300) == 0, log.read_text()  # (rank 1 took part in every step's all-reduce)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert not alive(rank1)


SPARES = """
import json, os, signal, sys, threading
import torch
from baton.workers.parallel import spare_ranks
if sys.argv[1] == "thread":
    threading.Thread(target=threading.Event().wait, daemon=True).start()  # (runs until this process ends)
spare_ranks.fork(2)
holder = 0
if sys.argv[1] == "held":  # another process holds the spares' pipes open: only PR_SET_PDEATHSIG ends them
    holder = os.fork()
    if holder == 0:
        signal.pause()  # until the test SIGKILLs it
        os._exit(0)
print(json.dumps({"spares": [s.proc.pid for s in spare_ranks._spares], "holder": holder}), flush=True)
if sys.stdin.readline().strip() == "close":
    codes = []
    for spare in spare_ranks._spares:
        spare.orders.close()
        codes.append(spare.proc.wait(timeout=30))
    print(json.dumps(codes), flush=True)
    sys.stdin.readline()
"""


def _forker(how: str = "plain") -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-c", SPARES, how], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=REPO, env=baton_env())
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def _finish(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_spares_die_with_the_process_that_forked_them_even_by_sigkill_with_their_pipes_held_open():
    proc, forked = _forker("held")
    spares, holder = forked["spares"], forked["holder"]
    try:
        assert len(spares) == 2 and all(_ppid(pid) == proc.pid for pid in spares)
        wait_for(lambda: all(_comm(pid) == "baton-rank" for pid in spares), timeout=10, what="the spares' names")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        wait_for(lambda: all(not alive(pid) for pid in spares), timeout=10, what="the spares to die with their parent")
    finally:
        _finish(proc)
        os.kill(holder, signal.SIGKILL)


def test_a_spare_no_attempt_takes_exits_at_its_closed_pipe():
    proc, _ = _forker()
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("close\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline()) == [0, 0]
    finally:
        _finish(proc)


def test_a_process_running_a_thread_forks_no_spare():
    proc, forked = _forker("thread")
    try:
        assert forked["spares"] == []
    finally:
        _finish(proc)


FORGETS = """
import sys
from multiprocessing import resource_tracker
from baton.storage import forked
resource_tracker.ensure_running()  # this process's tracker: a descriptor of its own
assert resource_tracker._resource_tracker._fd is not None
child = forked.fork("probe", (), lambda: 0 if resource_tracker._resource_tracker._fd is None else 3)
sys.exit(child.wait(timeout=30))
"""


def test_a_forked_child_holds_none_of_its_parents_multiprocessing_helpers():
    """Its parent's resource tracker's descriptor is closed in the child: kept as a number, the job's code
    (a SharedMemory) would write into whatever file or socket reuses it."""
    done = subprocess.run([sys.executable, "-c", FORGETS], capture_output=True, text=True, cwd=REPO, env=baton_env(),
                          timeout=60)
    assert done.returncode == 0, done.stderr
