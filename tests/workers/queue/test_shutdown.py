"""G4's edges: a second signal, and a checkpoint that cannot be uploaded within the grace period.
Either way the worker releases its job and exits promptly, and the job still ends bit-exact."""
from __future__ import annotations

import pytest

import signal
import time

from baton.schemas.settings import BatonSettings
from tests.helpers import assert_same_training
from tests.netfault import FaultyProxy
from tests.workers.queue.test_worker_loss import SPEC, running_at_step, wait_for

EXIT_RELEASED = 75


@pytest.mark.slow
def test_a_second_sigterm_releases_the_job_and_exits_at_once(cluster, reference):
    cluster.start_workers(2)
    job = cluster.client.submit(SPEC, "twice")
    holder = cluster.worker(wait_for(running_at_step(job, 6)).worker)
    holder.signal(signal.SIGTERM, group=False)
    holder.signal(signal.SIGTERM, group=False)
    assert holder.proc.wait(timeout=30) in (0, EXIT_RELEASED)  # released by the first or the second, never hung
    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded" and final.lost == 0 and final.worker != holder.name
    assert_same_training(reference, "reference", cluster.store(), "twice")


@pytest.mark.slow
def test_an_upload_that_cannot_finish_is_cut_off_by_the_grace_period(cluster, reference, s3_server):
    proxy = FaultyProxy(s3_server.port)
    try:
        held, = cluster.start_workers(1, AWS_ENDPOINT_URL=proxy.endpoint_url, BATON_PREEMPT_GRACE_S="3")
        job = cluster.client.submit(SPEC, "stuck")
        wait_for(running_at_step(job, 6))
        proxy.set("hold")  # storage hangs: the stop checkpoint cannot be committed
        signalled = time.monotonic()
        held.signal(signal.SIGTERM, group=False)
        assert held.proc.wait(timeout=30) == EXIT_RELEASED
        assert time.monotonic() - signalled < 3 + BatonSettings().heartbeat_s + 5
        assert "grace period of 3s over" in held.log()
        status = job.status()
        assert status.state.value == "retrying" and status.lost == 0  # released, not left to a lease expiry
    finally:
        proxy.close()
    cluster.start_workers(1)  # a healthy worker takes it from its last committed checkpoint
    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded"
    assert_same_training(reference, "reference", cluster.store(), "stuck")
