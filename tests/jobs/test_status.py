"""What `baton status` tells about a job on real workers: the task's own metrics, the monitored one
first; epochs counted from 1 in log lines as in the status; the step of the checkpoint a cancelled job
stopped with; and, for a job that waits, that no live worker serves its queue."""
from __future__ import annotations

import pytest

import re

from baton.storage.records import job_records as records
from baton.jobs.display import details
from tests.helpers import make_spec, run_baton
from tests.workers.conftest import SPEC
from tests.workers.queue.test_worker_loss import running_at_step, wait_for

REGRESSION = make_spec(model={"target": "builtin:mlp", "kwargs": {"in_features": 10, "hidden": 16, "out_features": 1}},
                       data={"target": "builtin:diabetes", "kwargs": {}, "batch_size": 64},
                       task={"target": "builtin:regression"}, scheduler={"name": "none"}, loop={"epochs": 3},
                       checkpoint={"every_steps": None, "monitor": "val_mae", "mode": "min"})


@pytest.mark.slow
def test_status_of_a_cancelled_a_finished_and_a_failed_job_on_one_worker(cluster):
    """Three jobs one after the other on one worker: the cancelled one's status shows the step of the
    checkpoint it stopped with, and its history; the finished one the task's own metrics, the monitored one
    first, epochs counted from 1; the failed one where it failed and at which step."""
    cluster.start_workers(1)
    job = cluster.client.submit(SPEC, "stopped")  # (first: the others wait behind it)
    regress = cluster.client.submit(REGRESSION, "regress")
    broken = cluster.client.submit(make_spec(data={"target": "tests.probes:failing_at", "kwargs": {"index": 0},
                                                   "num_workers": 2}, loop={"epochs": 2}), "broken")
    _cancelled_status(cluster, job)
    _metrics_status(regress)
    _failed_status(broken)


def _cancelled_status(cluster, job) -> None:
    wait_for(running_at_step(job, 3))
    assert job.cancel() == "requested"
    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "cancelled"
    assert final.latest_checkpoint.endswith(f"/step-{final.step}.pt"), (final.step, final.latest_checkpoint)

    # its history, oldest first (`baton status JOB --events`): what happened to it, not only the last event
    assert [e.kind for e in job.events()][:2] == ["submitted", "claimed"] and job.events()[-1].kind == "cancelled"
    shown = run_baton("status", "stopped", "--events", env=cluster.env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["TIME", "ATTEMPT", "EVENT", "STEP", "WORKER", "WHAT"]
    assert lines[1].split()[2:4] == ["0", "submitted"] and lines[2].split()[2:4] == ["1", "claimed"], shown.stdout
    assert lines[-1].split()[3] == "cancelled" and "w0@test" in lines[-1], shown.stdout
    nothing = run_baton("status", "nobody", "--events", env=cluster.env)
    assert (nothing.returncode, nothing.stderr.strip()) == (1, "no job 'nobody'"), nothing.stderr
    assert run_baton("status", "--events", env=cluster.env).returncode == 2


def _metrics_status(job) -> None:
    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded", final.error
    assert final.monitor == "val_mae" and set(final.metrics) == {"val_loss", "val_mae"}
    shown = [line.split(":")[0].strip() for line in details(final).splitlines()]
    assert shown[shown.index("loss") + 1:shown.index("loss") + 3] == ["val_mae (monitored)", "val_loss"]
    assert "val_accuracy" not in shown
    assert re.search(r"best checkpoint: \S+ \(val_mae \d", details(final))
    log = job.logs()
    assert re.search(r"epoch 1: step \d+ train_loss", log) and not re.search(r"epoch 0: step", log)
    assert final.epoch == final.epochs == 3 and re.search(r"epoch 3: step \d+ train_loss", log)


def _failed_status(job) -> None:
    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "failed"
    assert final.error.startswith("ValueError: record 0 is corrupt (in DataLoader worker process "), final.error
    where = re.search(r"; while loading sample 0 of the training set \(its index in your data set\); "
                      r"while training step (\d+) \(epoch 1, its batch \d+\)$", final.error)
    assert where, final.error
    assert final.step == int(where[1]) - 1  # the steps completed before it, not the last progress written
    assert "Traceback (most recent call last)" in final.traceback


@pytest.mark.slow
def test_a_job_on_a_queue_no_live_worker_serves_says_so_until_one_does(cluster, monkeypatch):
    monkeypatch.setattr(records, "UNSERVED_AFTER_S", 1.0)
    cluster.start_workers(1, queues="default")
    quick = make_spec(loop={"epochs": 1}, scheduler={"name": "none"})
    waiting = cluster.client.submit({**quick, "resources": {**quick["resources"], "queue": "gpu"}}, "unserved")
    served = cluster.client.submit(quick, "served")
    status = wait_for(lambda: waiting.status().waiting and waiting.status(), timeout=30)
    assert status.state.value == "queued"
    assert status.waiting.startswith("no live worker serves queue 'gpu': start one with `baton worker --queues gpu`")
    assert "no live worker serves" in details(status)
    assert served.wait(timeout=60, progress=False).waiting is None
    assert (waiting.status().state.value, waiting.status().attempt) == ("queued", 0)  # the default worker never took it
    gpu_worker, = cluster.start_workers(1, queues="gpu")
    wait_for(lambda: waiting.status().waiting is None, timeout=30)
    final = waiting.wait(timeout=60, progress=False)
    assert final.state.value == "succeeded" and final.worker == gpu_worker.name
