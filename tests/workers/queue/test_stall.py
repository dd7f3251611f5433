"""A job that hangs (user code or a data loader stuck) while its heartbeat keeps the lease alive:
the stall watchdog releases it as a worker loss with every thread's stack in its status, and the
worker process exits (a hung thread cannot be interrupted) for its supervisor to restart."""
from __future__ import annotations

import os
import signal
import time

from baton.workers.queue.stall import EXIT_STALLED

from tests.helpers import make_spec

HANGING = make_spec(model={"target": "tests.probes:hanging_mlp", "kwargs": {"hang_after": 6}},
                    retry={"max_attempts": 2})


def test_a_hung_job_is_released_with_its_stacks_and_the_worker_exits(cluster):
    hung, = cluster.start_workers(1, BATON_STALL_TIMEOUT_S="3")
    job = cluster.client.submit(HANGING, "hung")
    assert hung.proc.wait(timeout=90) == EXIT_STALLED
    status = job.status()
    assert (status.state.value, status.attempt, status.lost) == ("retrying", 1, 1)  # a worker loss: counted
    assert "no optimizer step for" in status.last_event
    assert "_hang_forever" in status.stall_stacks and "baton-heartbeat" in status.stall_stacks  # every thread

    # retried on a fresh worker, where it hangs again: a hang that repeats ends at retry.max_attempts
    again, = cluster.start_workers(1, BATON_STALL_TIMEOUT_S="3")
    assert again.proc.wait(timeout=90) == EXIT_STALLED
    final = job.wait(timeout=30, progress=False)
    assert (final.state.value, final.attempt, final.lost) == ("failed", 2, 2)
    assert "retry.max_attempts" in final.error and "_hang_forever" in final.traceback


def _descendants(root: int) -> set[int]:
    """Every process below ``root`` now, from /proc (the test's own view, not baton's)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parents[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan waits for init to reap it: it runs no more)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_watchdogs_exit_leaves_no_process_of_the_job_behind(cluster, tmp_path):
    """A DataLoader worker process hung in the data set's code outlived the worker (ppid 1, its
    memory held for good): the watchdog's exit must take every process below the worker with it."""
    pid_file, hanging_file = tmp_path / "loader.pids", tmp_path / "hanging.pids"
    spec = make_spec(data={"target": "tests.probes:hanging_in_loader", "num_workers": 1,
                           "kwargs": {"n_per_class": 300, "pid_file": str(pid_file),
                                      "hanging_file": str(hanging_file), "hang_after": 96}},
                     retry={"max_attempts": 1})
    hung, = cluster.start_workers(1, BATON_STALL_TIMEOUT_S="6")
    cluster.client.submit(spec, "hung-loader")
    deadline = time.monotonic() + 60
    while not hanging_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hanging_file.exists(), hung.log()
    below = _descendants(hung.proc.pid)  # the loader worker, the checkpoint writer, ...
    loaders = {int(line) for line in pid_file.read_text().split()}
    assert loaders and loaders <= below

    assert hung.proc.wait(timeout=90) == EXIT_STALLED
    deadline = time.monotonic() + 5
    while any(_running(pid) for pid in below) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = sorted(pid for pid in below if _running(pid))
    try:
        assert not left, f"processes of the stalled worker still running after it exited: {left}"
    finally:
        for pid in left:  # never leave them to the next test
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
