"""A worker that may not import a job's code (its BATON_ALLOWED_MODULES leaves the module out) passes
the job on, as one with too few GPUs does, instead of failing it for good; a worker allowed to run it
then does, and no attempt was used."""
from __future__ import annotations

import pytest

from tests.helpers import make_spec
from tests.workers.queue.test_worker_loss import wait_for

USER_MODEL = make_spec(model={"target": "tests.probes:linear", "kwargs": {}}, loop={"epochs": 1},
                       scheduler={"name": "none"})


@pytest.mark.slow
def test_a_worker_not_allowed_the_jobs_module_passes_it_on_to_one_that_is(cluster):
    strict, = cluster.start_workers(1, BATON_ALLOWED_MODULES="teamcode")
    job = cluster.client.submit(USER_MODEL, "elsewhere")
    status = wait_for(lambda: (s := job.status()).last_event and s, timeout=60)
    assert status.state.value == "queued" and status.attempt == 0, status
    assert ("model.target: module 'tests.probes' is not allowed here (BATON_ALLOWED_MODULES=teamcode) on "
            f"{strict.name}") in status.last_event
    from baton.jobs.display import details

    assert "last event: waiting for a worker that can host it" in details(status)
    allowed, = cluster.start_workers(1)
    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded", final.error
    assert final.worker == allowed.name and final.attempt == 1 and final.lost == 0
