"""On real workers: a job submitted with ``pause_at`` is recorded paused at its validation, out of the pool
(a worker's only slot goes to the next job); ``baton resume`` continues it to its next pause or its end,
bit-equal to a run never paused and redoing no step; a paused job can be cancelled; only a paused job
resumes to pause again."""
from __future__ import annotations

import pytest

from baton.storage.records import events

from tests.helpers import assert_same_training, run_baton, run_reference
from tests.probes import forwards_counted
from tests.workers.attempt.test_pause import STEPS_PER_EPOCH, spec_counted


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    (root / "forwards").mkdir()
    store = run_reference(root / "run", spec_counted(root / "forwards"))
    return store, sum(forwards_counted(str(root / "forwards")).values())


@pytest.mark.slow
def test_a_paused_job_leaves_the_pool_and_resumes_bit_equal(cluster, tmp_path, reference):
    cluster.start_workers(1)  # one slot: the second job runs only if the paused first holds none
    client = cluster.client
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    job = client.submit(spec_counted(tmp_path / "a"), "rung", pause_at=1)
    other = client.submit(spec_counted(tmp_path / "b"), "dropped", pause_at=1)

    paused = job.wait(timeout=180, progress=False)
    assert (paused.state.value, paused.step, paused.pause_at) == ("paused", STEPS_PER_EPOCH, 1), paused
    assert paused.last_event.startswith(f"paused at step {STEPS_PER_EPOCH} on w0@test"), paused.last_event
    assert other.wait(timeout=180, progress=False).state.value == "paused"

    done = run_baton("resume", "rung", "--pause-at", "2", env=cluster.env)
    assert done.returncode == 0 and "rung: queued as attempt 2" in done.stdout, done.stdout + done.stderr
    again = job.wait(timeout=180, progress=False)
    assert (again.state.value, again.step, again.pause_at) == ("paused", 2 * STEPS_PER_EPOCH, 2), again

    assert other.cancel() == "cancelled"
    assert other.status().state.value == "cancelled"

    assert job.resume() == 3
    final = job.wait(timeout=180, progress=False)
    assert (final.state.value, final.attempt, final.lost, final.pause_at) == ("succeeded", 3, 0, None), final
    store, reference_forwards = reference
    assert_same_training(store, "reference", cluster.store(), "rung")
    assert sum(forwards_counted(str(tmp_path / "a")).values()) == reference_forwards  # no step redone

    kinds = [e.kind for e in events.events(client.records.redis, "rung")]
    assert kinds.count("paused") == 2 and kinds.count("continued") == 2, kinds
    with pytest.raises(ValueError, match="only a paused job resumes to pause again"):
        job.resume(pause_at=3)
    refused = run_baton("resume", "rung", "--pause-at", "0", env=cluster.env)
    assert refused.returncode == 2 and "--pause-at" in refused.stderr, refused.stderr
