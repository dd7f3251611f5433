"""A worker runs a job only on a store it has probed and that holds the job's spec: a job queued with
a file:// directory that is not the worker's own store is passed on, the status saying why (it ran on
each worker's own disk, resumed from nothing after a loss, and left the client nothing to fetch); the
client warns when it queues a job with a file:// store."""
from __future__ import annotations

import pytest

from baton.jobs.client import JobClient
from baton.schemas.errors import LocalStoreWarning
from tests.helpers import make_spec, run_baton, write_spec
from tests.workers.queue.test_worker_loss import wait_for

QUICK = make_spec(loop={"epochs": 1}, scheduler={"name": "none"})


@pytest.mark.slow
def test_a_job_on_a_file_store_not_the_workers_own_is_passed_on_saying_why(cluster, tmp_path):
    worker, = cluster.start_workers(1)  # its store: the cluster's S3 bucket
    local = JobClient(redis_url=cluster.redis_url, storage_url=f"file://{tmp_path / 'laptop'}")
    with pytest.warns(LocalStoreWarning, match="a directory of this machine"):
        job = local.submit(QUICK, "on-my-disk")
    status = wait_for(lambda: (s := job.status()).last_event and s, timeout=60)
    assert status.state.value == "queued" and status.attempt == 0, status
    assert (f"its store file://{tmp_path / 'laptop'} is a directory on the submitting machine, and this worker's "
            f"store is {cluster.storage_url}") in status.last_event
    assert worker.name in status.last_event
    assert not (tmp_path / "laptop" / "jobs" / "on-my-disk" / "manifest.json").exists()  # nothing trained


@pytest.mark.slow
def test_a_job_whose_store_does_not_hold_its_spec_is_passed_on(cluster):
    import redis

    from baton.storage.records import keys

    job = cluster.client.submit(QUICK, "moved")
    cluster.store().delete("jobs/moved/spec.json")  # as a worker seeing another bucket of that name would
    cluster.start_workers(1)
    status = wait_for(lambda: (s := job.status()).last_event and "does not hold its spec" in s.last_event and s,
                      timeout=60)
    assert status.state.value == "queued" and status.attempt == 0, status
    assert redis.Redis.from_url(cluster.redis_url).hget(keys.job("moved"), "attempt") in (b"0", None)


def test_submit_warns_in_one_line_when_the_store_is_a_local_directory(cluster, tmp_path):
    spec = write_spec(tmp_path, QUICK)
    result = run_baton("submit", str(spec), "--id", "warned",
                       env={**cluster.env, "BATON_STORAGE_URL": f"file://{tmp_path / 'here'}"})
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(f"warning: the job is stored under file://{tmp_path / 'here'}, a directory"), result.stderr
