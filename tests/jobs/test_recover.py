"""Redis lost without persistence (defect 9): every record vanishes, the checkpoints survive in the
store. `baton recover` rebuilds the records from spec.json + manifest.json and queues unfinished
jobs again; a recovered job resumes from its last checkpoint and ends bit-exact."""
from __future__ import annotations

import json
import time

import pytest
import redis as redis_lib

from baton.schemas.errors import SpecError
from tests.helpers import assert_same_training, kill_when, make_spec, read_manifest, run_baton, run_reference, write_spec

# ~0.1 s per optimizer step (slow data): long enough to act mid-epoch
SPEC = make_spec(data={"target": "tests.probes:slow_spiral", "kwargs": {"n_per_class": 300, "delay_s": 0.003}},
                 loop={"epochs": 2}, checkpoint={"every_steps": 4, "keep_last": 3})


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_reference(tmp_path_factory.mktemp("reference"), SPEC)


def _wait_running(job, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = job.status()
        if status.state.value == "running" and (status.step or 0) >= 1:
            return status
        time.sleep(0.05)
    raise AssertionError("the job never started")


def mid_epoch_checkpoint(manifest: dict) -> bool:
    latest = manifest["checkpoints"][-1] if manifest["checkpoints"] else None
    return latest is not None and latest["kind"] == "step" and latest["batch_in_epoch"] > 0


@pytest.mark.slow
def test_a_job_whose_record_redis_lost_is_recovered_and_resumes_bit_exact(cluster, reference):
    (worker,) = cluster.start_workers(1)
    job = cluster.client.submit(SPEC, "forgotten")
    _wait_running(job)
    committed = kill_when(worker.proc, cluster.store(), "forgotten", mid_epoch_checkpoint)
    redis_lib.Redis.from_url(cluster.redis_url).flushall()  # Redis restarted without persistence

    with pytest.raises(SpecError, match="already exists"):  # the defect: the id is taken, nothing to resume
        cluster.client.submit(SPEC, "forgotten")
    assert run_baton("resume", "forgotten", env=cluster.env).returncode == 1

    done = run_baton("recover", "--all", env=cluster.env)
    assert done.returncode == 0, done.stdout + done.stderr
    queued_as = committed["attempt"] + 2  # one attempt number skipped past the manifest's
    assert f"forgotten: record rebuilt, queued as attempt {queued_as} (from step {committed['checkpoints'][-1]['step']})" \
        in done.stdout, done.stdout

    cluster.start_workers(1)
    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded", final.error
    assert final.attempt == queued_as and final.resumed_from == committed["checkpoints"][-1]["step"]
    assert read_manifest(cluster.store(), "forgotten")["attempt"] == queued_as
    assert_same_training(reference, "reference", cluster.store(), "forgotten")


@pytest.mark.slow
def test_a_finished_job_is_recovered_as_succeeded_and_a_live_record_is_left_alone(cluster):
    spec = make_spec(loop={"epochs": 1}, checkpoint={"every_steps": 10})
    path = write_spec(cluster.log_dir, spec)
    ran = run_baton("run", str(path), "--id", "finished", "--storage", cluster.storage_url, env=cluster.env)
    assert ran.returncode == 0, ran.stdout + ran.stderr  # in-process: the store has it, Redis never did
    steps = read_manifest(cluster.store(), "finished")["checkpoints"][-1]["step"]

    done = run_baton("recover", "finished", env=cluster.env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"finished: record rebuilt as succeeded (attempt 1, step {steps})" in done.stdout
    status = cluster.client.job("finished").status()
    assert (status.state.value, status.step, status.attempt) == ("succeeded", steps, 1)
    assert len(cluster.client.job("finished").metrics()) == 1

    again = run_baton("recover", "--all", env=cluster.env)
    assert "finished: has a record (attempt 1); left alone" in again.stdout, again.stdout
    missing = run_baton("recover", "nosuchjob", env=cluster.env)
    assert missing.returncode == 1 and "no job 'nosuchjob'" in missing.stderr
    assert run_baton("recover", env=cluster.env).returncode == 2  # neither JOB nor --all


def test_a_job_whose_stored_spec_is_unreadable_is_skipped_and_the_others_recovered(redis_server, tmp_path):
    from baton.jobs.recover import recover_jobs
    from baton.storage.records.job_records import JobRecords
    from baton.storage.stores.file_store import FileStore as Store

    client = redis_lib.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushdb()
    store = Store(tmp_path / "store")
    store.put_bytes("jobs/broken/spec.json", b"{not json")
    store.put_bytes("jobs/renamed/spec.json", b'{"name": "x", "epochs": 3}')
    store.put_bytes("jobs/fine/spec.json", json.dumps(make_spec()).encode())
    published = []

    found = recover_jobs(JobRecords(client), store, lambda job_id, attempt: published.append((job_id, attempt)))
    assert [(r.job_id, r.action) for r in found] == [("broken", "skipped"), ("fine", "queued"), ("renamed", "skipped")]
    assert "unreadable" in found[0].reason and "epochs: unknown field" in found[2].reason
    assert published == [("fine", 2)]  # no manifest yet: attempt 0, one number skipped, the next one queued
    assert JobRecords(client).status("fine").state.value == "retrying"
    assert not JobRecords(client).exists("broken")
