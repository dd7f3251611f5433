"""A job that hangs (user code or a data loader stuck) while its heartbeat keeps the lease alive:
the stall watchdog releases it as a worker loss with every thread's stack of its training process
in its status, and kills that process and every process below it; the worker goes on."""
from __future__ import annotations

import pytest

import os
import signal
import time

from tests.helpers import descendants, make_spec
from tests.workers.queue.test_worker_loss import wait_for

HANGING = make_spec(model={"target": "tests.probes:hanging_mlp", "kwargs": {"hang_after": 6}},
                    retry={"max_attempts": 2})


@pytest.mark.slow
def test_a_hung_job_is_released_with_its_stacks_and_the_worker_goes_on(cluster):
    hung, = cluster.start_workers(1, BATON_STALL_TIMEOUT_S="3")
    job = cluster.client.submit(HANGING, "hung")
    first = wait_for(lambda: (s := job.status()).stall_stacks and s, timeout=90)
    assert "no optimizer step for" in first.last_event and first.lost == 1  # a worker loss: counted
    # every thread of the training process (its channel to the worker among them), not the worker's
    assert "_hang_forever" in first.stall_stacks and "baton-channel" in first.stall_stacks
    assert "baton-heartbeat" not in first.stall_stacks

    # the same worker takes it again, where it hangs again: a hang that repeats ends at retry.max_attempts
    final = job.wait(timeout=90, progress=False)
    assert (final.state.value, final.attempt, final.lost) == ("failed", 2, 2)
    assert "retry.max_attempts" in final.error and "_hang_forever" in final.traceback
    assert hung.proc.poll() is None, hung.log()  # the worker lives on


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan waits for init to reap it: it runs no more)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_stalled_job_leaves_no_process_behind(cluster, tmp_path):
    """A DataLoader worker process hung in the data set's code outlived its parent (ppid 1, its memory
    held for good): the watchdog must take every process below the training process with it."""
    pid_file, hanging_file = tmp_path / "loader.pids", tmp_path / "hanging.pids"
    spec = make_spec(data={"target": "tests.probes:hanging_in_loader", "num_workers": 1,
                           "kwargs": {"n_per_class": 300, "pid_file": str(pid_file),
                                      "hanging_file": str(hanging_file), "hang_after": 96}},
                     retry={"max_attempts": 1})
    hung, = cluster.start_workers(1, BATON_STALL_TIMEOUT_S="6")
    job = cluster.client.submit(spec, "hung-loader")
    deadline = time.monotonic() + 60
    while not hanging_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hanging_file.exists(), hung.log()
    training = job.status().pid
    below = descendants(training) | {training}  # the loader worker, the checkpoint writer, ...
    loaders = {int(line) for line in pid_file.read_text().split()}
    assert loaders and loaders <= below

    final = job.wait(timeout=90, progress=False)
    assert final.state.value == "failed" and "no optimizer step" in final.error
    deadline = time.monotonic() + 5
    while any(_running(pid) for pid in below) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = sorted(pid for pid in below if _running(pid))
    try:
        assert not left, f"processes of the stalled job still running: {left}"
        assert hung.proc.poll() is None, hung.log()  # the worker lives on
    finally:
        for pid in left:  # never leave them to the next test
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
