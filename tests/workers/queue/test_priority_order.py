"""A real worker starts the waiting jobs of its queue in their start order, whatever order their
messages arrive in: priority first, then submit time; `position`, the status's reason and `baton queue`
say so while they wait."""
from __future__ import annotations

import pytest

from tests.helpers import make_spec, run_baton
from tests.workers.queue.test_worker_loss import wait_for

QUICK = make_spec(loop={"epochs": 1}, data={"batch_size": 64, "kwargs": {"n_per_class": 60}}, scheduler={"name": "none"})
BLOCKER = make_spec(loop={"epochs": 50}, data={"target": "tests.probes:slow_spiral", "batch_size": 32,
                                               "kwargs": {"n_per_class": 100, "delay_s": 0.002}},
                    resources={"priority": 20}, checkpoint={"min_interval_s": 1})  # (spaced: 50 short epochs)


def _with(spec: dict, **resources) -> dict:
    return {**spec, "resources": {**spec["resources"], **resources}}


@pytest.mark.slow
def test_waiting_jobs_start_by_priority_then_submit_time_and_say_where_they_stand(cluster):
    worker, = cluster.start_workers(1)
    client = cluster.client
    blocker = client.submit(BLOCKER, "blocker")
    wait_for(lambda: blocker.status().state.value == "running", timeout=120)

    x1 = client.submit(_with(QUICK, priority=0), "x1")
    x2 = client.submit(_with(QUICK, priority=5), "x2")
    x3 = client.submit(_with(QUICK, priority=0), "x3")
    statuses = [job.status() for job in (x1, x2, x3)]
    assert [s.position for s in statuses] == [2, 1, 3]
    assert statuses[0].waiting == "behind 1 job(s) of higher priority"
    assert statuses[1].waiting == "next to start: every worker serving queue default is busy"
    assert statuses[2].priority == 0 and statuses[1].priority == 5 and statuses[0].team == "default"

    shown = run_baton("queue", env=cluster.env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    waiting = [line.split()[1] for line in lines[lines.index("waiting, in the order they will start:") + 2:][:3]]
    assert waiting == ["x2", "x1", "x3"], shown.stdout
    assert any(line.startswith("blocker") and worker.name in line for line in lines), shown.stdout

    assert blocker.cancel() == "requested"  # the worker frees: it takes x2's place first, though x1's message came first
    finals = [job.wait(timeout=180, progress=False) for job in (x1, x2, x3)]
    assert all(s.state.value == "succeeded" and s.worker == worker.name for s in finals), finals
    ended = sorted(finals, key=lambda s: float(client.records.raw(s.id)["finished_at"]))  # one worker: one at a time
    assert [s.id for s in ended] == ["x2", "x1", "x3"]
    assert all(s.position is None for s in finals)
