"""G3/G4/G5 end to end: real `baton worker` processes, real Redis and S3 (moto over HTTP), real
signals. Every surviving job must end bit-identical to `baton run` of the same spec."""
from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest

from baton.schemas.settings import BatonSettings
from baton.storage.checkpointing.writer_start import is_writer
from baton.storage.records.messages import make_app, publish_run

from tests.helpers import (assert_same_training, descendants, kill_when, make_spec, read_manifest, run_baton,
                           wait_for)
from tests.workers.conftest import SPEC  # noqa: F401 (tests in other modules import it from here)

# `reference`: SPEC run uninterrupted, once per session (tests/workers/conftest.py)


def running_at_step(job, step: int):
    def check():
        status = job.status()
        return status if status.state.value == "running" and (status.step or 0) >= step else None
    return check


def mid_epoch_checkpoint(manifest: dict) -> bool:
    """``kill_when``'s moment: the job's latest committed checkpoint was taken mid-epoch."""
    latest = manifest["checkpoints"][-1] if manifest["checkpoints"] else None
    return latest is not None and latest["kind"] == "step" and latest["batch_in_epoch"] > 0


@pytest.mark.slow
def test_sigkill_mid_epoch_resumes_on_the_other_worker_bit_exact(cluster, reference):
    cluster.start_workers(2)
    job = cluster.client.submit(SPEC, "killed")
    holder = cluster.worker(wait_for(running_at_step(job, 1)).worker)
    committed = kill_when(holder.proc, cluster.store(), "killed", mid_epoch_checkpoint)  # the whole process group

    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded", final.error
    assert (final.attempt, final.lost) == (2, 1) and final.worker != holder.name
    assert final.resumed_from == committed["checkpoints"][-1]["step"]
    assert_same_training(reference, "reference", cluster.store(), "killed")


@pytest.mark.slow
def test_sigterm_checkpoints_at_the_step_and_hands_over_without_the_lease(cluster, reference):
    cluster.start_workers(2)
    job = cluster.client.submit(SPEC, "preempted")
    status = wait_for(running_at_step(job, 10))
    holder = cluster.worker(status.worker)
    step_at_signal = job.status().step
    holder.signal(signal.SIGTERM, group=False)

    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded", final.error
    assert final.lost == 0  # released by its worker, not reaped after a lease expiry
    assert final.attempt == 2 and final.worker != holder.name
    stopped = re.search(r"job preempted: stopped at step (\d+) after a committed checkpoint \(preempted\)", holder.log())
    assert stopped, holder.log()
    assert final.resumed_from == int(stopped[1]) >= step_at_signal  # nothing trained was lost
    assert f"released (preempted (SIGTERM) on {holder.name}), queued as attempt 2" in holder.log()  # the job's event
    assert holder.proc.wait(timeout=30) == 0  # and the worker exited on its own
    assert_same_training(reference, "reference", cluster.store(), "preempted")


@pytest.mark.slow
def test_a_duplicate_delivery_is_dropped_and_only_one_worker_trains(cluster, reference):
    w0, w1 = cluster.start_workers(2)
    job = cluster.client.submit(SPEC, "twice")
    publish_run(make_app(BatonSettings(redis_url=cluster.redis_url)), "twice", 1, "default")  # the same message again

    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded" and final.attempt == 1 and final.lost == 0
    logs = w0.log() + w1.log()
    wait_for(lambda: "job twice attempt 1: dropped" in w0.log() + w1.log(), timeout=10)
    assert logs.count("job twice: attempt 1 started") == 1
    assert_same_training(reference, "reference", cluster.store(), "twice")


@pytest.mark.slow
def test_a_worker_paused_past_its_lease_is_fenced_out(cluster, reference):
    cluster.start_workers(2)
    job = cluster.client.submit(SPEC, "paused")
    holder = cluster.worker(wait_for(running_at_step(job, 8)).worker)
    holder.signal(signal.SIGSTOP)
    taken_over = wait_for(lambda: (s := job.status()).attempt == 2 and s.state.value == "running" and s, timeout=60)
    assert taken_over.worker != holder.name
    resumed_at = time.time()
    holder.signal(signal.SIGCONT)

    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded" and final.worker != holder.name and (final.attempt, final.lost) == (2, 1)
    wait_for(lambda: "job paused attempt 1: fenced out" in holder.log(), timeout=20)
    assert "job paused: released" not in holder.log() and "job paused: succeeded" not in holder.log()
    manifest = read_manifest(cluster.store(), "paused")
    assert not [e for e in manifest["checkpoints"] if e["attempt"] == 1 and e["created_at"] > resumed_at]
    assert_same_training(reference, "reference", cluster.store(), "paused")


USER_FAILURES = {"raising": "RuntimeError: boom from user model code",
                 "exiting": "SystemExit: 3",  # sys.exit() in the job's code
                 "cancelling": "CancelledError: cancelled inside the model"}  # a BaseException from its forward
"""Each probe's failure, as its job's error says it."""


@pytest.mark.slow
def test_user_code_exception_fails_once_with_its_traceback(cluster):
    """Three jobs whose own code fails, on one worker: each fails once, with its traceback, and is never
    retried."""
    from baton.storage.records import keys

    cluster.start_workers(1)
    jobs = {target: cluster.client.submit(make_spec(model={"target": f"tests.probes:{target}", "kwargs": {}}),
                                          f"broken-{target}") for target in USER_FAILURES}
    for target, error in USER_FAILURES.items():
        final = jobs[target].wait(timeout=120, progress=False)
        assert final.state.value == "failed" and final.attempt == 1, (final.state, final.attempt, final.error)
        assert error in final.error
        assert "Traceback" in final.traceback and "probes.py" in final.traceback
        # for a terminal: the cause first, then only the job's own frames; the whole traceback in its log
        assert final.failure.startswith(f"error: {error}") and "probes.py" in final.failure, final.failure
        assert "baton/" not in final.failure and final.failure.endswith(f"`baton logs {final.id}`"), final.failure
        # never retried: nothing of it is left for a reaper (no lease, not among the unfinished jobs)
        assert not cluster.client.records.redis.sismember(keys.ACTIVE, final.id)
        assert not cluster.client.records.redis.exists(keys.lease(final.id)) and final.lost == 0
    shown = run_baton("status", "broken-raising", env=cluster.env)
    failure = jobs["raising"].status().failure
    assert shown.returncode == 0 and len(shown.stdout.splitlines()) <= 40, shown.stdout  # (67-85 lines before)
    assert failure in shown.stdout and "delivery.py" not in shown.stdout, shown.stdout


@pytest.mark.slow
def test_cancel_stops_with_a_checkpoint_and_resume_finishes_bit_exact(cluster, reference):
    cluster.start_workers(1)
    job = cluster.client.submit(SPEC, "cancelled")
    wait_for(running_at_step(job, 6))
    assert job.cancel() == "requested"
    final = job.wait(timeout=60, progress=False)
    assert final.state.value == "cancelled"
    latest = read_manifest(cluster.store(), "cancelled")["checkpoints"][-1]
    assert latest["kind"] in ("stop", "epoch") and latest["attempt"] == 1

    assert job.resume() == 2
    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded" and final.resumed_from == latest["step"]
    assert_same_training(reference, "reference", cluster.store(), "cancelled")


def is_working_checkpoint_writer(pid: int) -> bool:
    """A checkpoint writer process (started as one, or forked from its training process: then named so)
    that has written a checkpoint (it maps the snapshot buffers then): one killed while it starts leaves
    the attempt's checkpoints to the training process's thread."""
    if not is_writer(pid):
        return False
    try:
        with open(f"/proc/{pid}/maps") as fh:
            return "baton-snapshot-" in fh.read()
    except OSError:
        return False


@pytest.mark.slow
def test_a_checkpoint_writer_killed_at_every_checkpoint_is_a_counted_loss_not_a_retry_for_ever(cluster):
    """As the OOM killer would: each attempt's writer process, once it has written a checkpoint, is
    SIGKILLed. A local process's death is the machine's fault, a worker loss counted against
    retry.max_attempts; only a store that cannot be reached is "storage unavailable" (released
    uncounted)."""
    worker, = cluster.start_workers(1)
    job = cluster.client.submit({**SPEC, "loop": {**SPEC["loop"], "epochs": 8}, "retry": {"max_attempts": 2}},
                                "writer-killed")
    stop = threading.Event()

    def kill_writers():
        while not stop.is_set():
            for pid in descendants(worker.proc.pid):
                if is_working_checkpoint_writer(pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            time.sleep(0.05)

    killer = threading.Thread(target=kill_writers, daemon=True)
    killer.start()
    try:
        final = job.wait(timeout=150, progress=False)
    finally:
        stop.set()
        killer.join()
    assert (final.state.value, final.attempt, final.lost) == ("failed", 2, 2), final
    assert "checkpoint writer process" in final.error and "max_attempts" in final.error, final.error


def held_spec(hold, hold_after: int, priority: int = 0, max_attempts: int = 2) -> dict:
    """SPEC, held still by tests.probes.slow_spiral's ``hold`` file after ``hold_after`` samples."""
    return make_spec(**{**SPEC, "data": {**SPEC["data"], "kwargs": {**SPEC["data"]["kwargs"], "hold": str(hold),
                                                                   "hold_after": hold_after}},
                        "resources": {**SPEC["resources"], "priority": priority},
                        "retry": {"max_attempts": max_attempts}})


@pytest.mark.slow
@pytest.mark.quick  # (stands for its module in the quick tier)
def test_a_cancel_asked_before_the_worker_or_its_training_process_dies_ends_the_job_cancelled(cluster, tmp_path):
    """The job is held between two steps (it cannot stop at its next step), a cancel is asked for, and then
    its training process (a crash: its worker would run it again here) or its whole worker (SIGKILL: the
    reaper would re-queue it) dies. Either way it ends cancelled at once, with its last commit, and makes
    nothing yield: neither trains it again, nor fails it for its last retry."""
    cluster.start_workers(2)
    holds = {name: tmp_path / f"hold-{name}" for name in ("low", "crashed", "killed")}
    for hold in holds.values():
        hold.touch()
    try:
        low = cluster.client.submit(held_spec(holds["low"], 0), "low")  # priority 0: the one a re-queue would stop
        wait_for(lambda: os.path.exists(f"{holds['low']}.held"), what="the low-priority job held")
        low_worker = low.status().worker

        crashed = cluster.client.submit(held_spec(holds["crashed"], 6 * 32, priority=5, max_attempts=1), "crashed")
        wait_for(lambda: os.path.exists(f"{holds['crashed']}.held"), what="the job held after 6 steps")
        assert crashed.cancel() == "requested"
        os.kill(crashed.status().pid, signal.SIGKILL)  # its training process dies before its next step
        final = wait_for(lambda: (s := crashed.status()).state.value != "running" and s, what="the crashed job's end")
        assert (final.state.value, final.attempt) == ("cancelled", 1), final  # (it failed: its last retry)
        holder = cluster.worker(final.worker)
        assert holder.name != low_worker and "attempt 2 started" not in holder.log()

        killed = cluster.client.submit(held_spec(holds["killed"], 6 * 32, priority=5), "killed")
        wait_for(lambda: os.path.exists(f"{holds['killed']}.held"), what="the job held after 6 steps")
        assert killed.status().worker == holder.name  # (the only free worker)
        assert killed.cancel() == "requested"
        holder.signal(signal.SIGKILL)  # the whole worker dies: its lease lapses
        final = wait_for(lambda: (s := killed.status()).state.value != "running" and s, what="the killed job's end")
        assert (final.state.value, final.attempt) == ("cancelled", 1), final  # (it waited, and made job low yield)
        assert "lost its worker" in final.last_event
        committed = read_manifest(cluster.store(), "killed")  # what a resume would start from
        assert committed and {e["attempt"] for e in committed["checkpoints"]} == {1}
        assert [e.kind for e in killed.events()][-2:] == ["lost", "cancelled"]

        still = low.status()
        assert (still.state.value, still.attempt, still.worker) == ("running", 1, low_worker)
        assert "yielded" not in [e.kind for e in low.events()] and not cluster.client.records.raw("low").get(
            "yield_requested")
    finally:
        for hold in holds.values():
            hold.unlink(missing_ok=True)
