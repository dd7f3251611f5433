"""A crash of the training process, with its worker alive: the worker sees it at once and resumes the
job itself from the state the process left in memory (storage/memory/memory_copy.py), bit-exact with a run
never interrupted. Steps redone are counted by the user's own model (tests.probes.counting_mlp)."""
from __future__ import annotations

import os
import re
import signal

import pytest

from tests.helpers import assert_same_training, make_spec, run_reference, uid_of
from tests.probes import forwards_counted
from tests.workers.queue.test_worker_loss import wait_for


def counting_spec(directory, hold=None, hold_after: int = 0) -> dict:
    # ~0.1 s a step (slow data), 23 steps an epoch, a copy in memory after every step, a durable checkpoint
    # every 8 steps; ``hold``: tests.probes.slow_spiral's hold file, loading waits after ``hold_after`` samples
    held = {"hold": str(hold), "hold_after": hold_after} if hold else {}
    return make_spec(model={"target": "tests.probes:counting_mlp", "kwargs": {"directory": str(directory)}},
                     data={"target": "tests.probes:slow_spiral", "kwargs": {"n_per_class": 300, "delay_s": 0.003,
                                                                             **held}},
                     loop={"epochs": 2}, checkpoint={"every_steps": 8, "keep_last": 3, "memory_every_steps": 1})


@pytest.fixture
def counted(tmp_path):
    directory = tmp_path / "forwards"
    directory.mkdir()
    reference_dir = tmp_path / "reference-forwards"
    reference_dir.mkdir()
    reference = run_reference(tmp_path / "reference", counting_spec(reference_dir))
    return directory, reference, sum(forwards_counted(str(reference_dir)).values())


HELD_AT = 13
"""The step after which the killed job is held still: 5 past its checkpoint of step 8, 3 before the next."""


def held_between_checkpoints(job, hold) -> object:
    """The job's status once its training process waits, held, to load the first sample of step
    ``HELD_AT + 1``: it has taken its copy of step ``HELD_AT`` in memory, and its latest durable checkpoint
    is step 8's at most. (Its reported step lags it: progress is sent at most every 0.1-0.5 s.)"""
    def held():
        status = job.status()
        waiting = hold.with_name(hold.name + ".held")
        pids = waiting.read_text().split() if waiting.exists() else []
        return status.state.value == "running" and status.pid and str(status.pid) in pids and status
    return wait_for(held, timeout=120, every=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("job_user", ["worker", ""], ids=["as-the-worker", "as-its-own-user"])
def test_the_training_process_sigkilled_resumes_from_memory_on_its_worker(cluster, counted, tmp_path, open_dir, job_user):
    """Also where the job runs as a user of its own (a root worker's default): its copies' directories are
    lent to it, and its worker, which cannot read its memory, resumes it from them."""
    directory, reference, reference_forwards = counted
    if job_user == "":  # (its files where that user may write them)
        directory, tmp_path = open_dir / "forwards", open_dir
        directory.mkdir(mode=0o777)
        directory.chmod(0o1777)
    cluster.start_workers(2, BATON_JOB_USER=job_user)
    hold = tmp_path / "hold"
    hold.touch()
    job = cluster.client.submit(counting_spec(directory, hold, hold_after=HELD_AT * 32), "crashed")  # (32 a batch)
    status, durable = held_between_checkpoints(job, hold), 8
    assert (uid_of(status.pid) == os.getuid()) == (job_user == "worker")
    os.kill(status.pid, signal.SIGKILL)  # the training process alone: its worker lives on
    hold.unlink()
    holder = cluster.worker(status.worker)

    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded", final.error
    assert (final.attempt, final.lost) == (2, 1) and final.worker == holder.name  # a loss, taken back here
    # Celery's warning to a root worker stands only where the job's code runs as root (the worker's user)
    assert ("running the worker with superuser privileges" in holder.log()) == (job_user == "worker")
    resumed = re.search(r"resuming from the in-memory copy of step (\d+)", holder.log())
    assert resumed, holder.log()
    assert final.resumed_from == int(resumed[1]) == HELD_AT > durable  # newer than the durable checkpoint
    event = re.search(rf"resumed in memory at step {final.resumed_from} after SIGKILL of pid {status.pid}, "
                      r"([\d.]+) s", holder.log())
    assert event, holder.log()
    assert final.pid != status.pid
    # the user's model trained the uninterrupted run's steps, plus at most the one the kill interrupted
    counts = forwards_counted(str(directory))
    assert set(counts) == {status.pid, final.pid}
    assert 0 <= sum(counts.values()) - reference_forwards <= 1, counts
    assert_same_training(reference, "reference", cluster.store(), "crashed")


@pytest.mark.slow
def test_a_crash_halfway_through_a_copy_falls_back_to_the_copy_before(cluster, counted, tmp_path):
    """The copy of step 7 is cut halfway (a failpoint kills the process there, part of the new state
    written over the slot's older copy): the worker resumes from step 6's copy, never the torn one."""
    directory, reference, reference_forwards = counted
    cluster.start_workers(1, BATON_FAILPOINT=f"memory-copy-torn@7:{tmp_path / 'fired'}")
    job = cluster.client.submit(counting_spec(directory), "torn")

    final = job.wait(timeout=180, progress=False)
    assert final.state.value == "succeeded", final.error
    assert (tmp_path / "fired").exists() and (final.attempt, final.lost) == (2, 1)
    assert final.resumed_from == 6, cluster.workers[0].log()
    assert "resuming from the in-memory copy of step 6" in cluster.workers[0].log()
    assert sum(forwards_counted(str(directory)).values()) - reference_forwards == 1  # step 7, trained twice
    assert_same_training(reference, "reference", cluster.store(), "torn")


@pytest.mark.slow
def test_what_a_crashed_training_process_leaves_is_killed_by_its_worker(cluster, tmp_path):
    """A DataLoader worker hung in the data set's code never looks at its parent again: when the training
    process is SIGKILLed, the worker (the subreaper of what its training processes leave) ends it."""
    from tests.workers.queue.test_stall import _running

    pid_file, hanging_file = tmp_path / "loader.pids", tmp_path / "hanging.pids"
    spec = make_spec(data={"target": "tests.probes:hanging_in_loader", "num_workers": 1,
                           "kwargs": {"n_per_class": 300, "pid_file": str(pid_file),
                                      "hanging_file": str(hanging_file), "hang_after": 96}},
                     retry={"max_attempts": 1})
    worker, = cluster.start_workers(1)
    job = cluster.client.submit(spec, "orphans")
    wait_for(hanging_file.exists, timeout=60)
    loaders = {int(line) for line in pid_file.read_text().split()}
    os.kill(job.status().pid, signal.SIGKILL)

    final = job.wait(timeout=60, progress=False)
    assert final.state.value == "failed" and "was killed by SIGKILL" in final.error  # its one attempt, lost
    wait_for(lambda: not any(_running(pid) for pid in loaders), timeout=10)
    assert worker.proc.poll() is None
