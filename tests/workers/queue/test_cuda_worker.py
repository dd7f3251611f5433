"""A CUDA job on real `baton worker` processes (needs a GPU). The worker's main process offers the GPU
without importing torch; the training process reports over the JSON channel (an fp16 job's losses and
its GradScaler's skipped steps among them); its memory copies and checkpoints hold CUDA state. A SIGKILL
of the training process resumes from its copy in memory, a SIGKILL of the whole worker on another worker
from the checkpoint: each ends bit-equal (torch.equal) to the same spec run uninterrupted on the GPU."""
from __future__ import annotations

import os
import re
import signal

import pytest
import redis

from baton.schemas.hosting import read_offer
from baton.storage.records.keys import WORKER_OFFERS

from tests.helpers import assert_same_training, kill_when, make_spec, run_reference, wait_for
from tests.probes import forwards_counted
from tests.workers.queue.test_crash_recovery import HELD_AT, counting_spec, held_between_checkpoints
from tests.workers.queue.test_worker_loss import mid_epoch_checkpoint, running_at_step

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

ON_CUDA = {"device": "cuda", "cpu_threads": 1}


def on_cuda(spec: dict) -> dict:
    return make_spec(**{**spec, "loop": {**spec["loop"], "precision": "fp16"}, "resources": ON_CUDA})


def test_each_worker_offers_its_gpu_and_a_cuda_job_killed_with_its_worker_resumes_bit_exact(cluster, tmp_path):
    spec = on_cuda(counting_spec(tmp_path))
    reference = run_reference(tmp_path / "reference", spec)
    workers = cluster.start_workers(2)
    offers = redis.Redis.from_url(cluster.redis_url, decode_responses=True).hgetall(WORKER_OFFERS)
    assert {w.name: read_offer(offers[w.name]).gpus for w in workers} == {w.name: 1 for w in workers}

    job = cluster.client.submit(spec, "cudakilled")
    holder = cluster.worker(wait_for(running_at_step(job, 1)).worker)
    committed = kill_when(holder.proc, cluster.store(), "cudakilled", mid_epoch_checkpoint)  # the whole process group

    final = job.wait(timeout=180, progress=False)
    assert final.state.value == "succeeded", final.error
    assert (final.attempt, final.lost) == (2, 1) and final.worker != holder.name
    assert final.resumed_from == committed["checkpoints"][-1]["step"]
    assert_same_training(reference, "reference", cluster.store(), "cudakilled")


def test_a_cuda_training_process_sigkilled_resumes_from_its_copy_in_memory_bit_exact(cluster, tmp_path):
    directory, reference_dir = tmp_path / "forwards", tmp_path / "reference-forwards"
    directory.mkdir()
    reference_dir.mkdir()
    reference = run_reference(tmp_path / "reference", on_cuda(counting_spec(reference_dir)))
    reference_forwards = sum(forwards_counted(str(reference_dir)).values())
    cluster.start_workers(1)
    hold = tmp_path / "hold"
    hold.touch()
    job = cluster.client.submit(on_cuda(counting_spec(directory, hold, hold_after=HELD_AT * 32)), "cudacrashed")
    status = held_between_checkpoints(job, hold)
    os.kill(status.pid, signal.SIGKILL)  # the training process alone: its worker lives on
    hold.unlink()

    final = job.wait(timeout=180, progress=False)
    assert final.state.value == "succeeded", final.error
    assert (final.attempt, final.lost) == (2, 1) and final.worker == status.worker
    resumed = re.search(r"resuming from the in-memory copy of step (\d+)", cluster.worker(status.worker).log())
    assert resumed and final.resumed_from == int(resumed[1]) == HELD_AT
    counts = forwards_counted(str(directory))
    assert set(counts) == {status.pid, final.pid}
    assert 0 <= sum(counts.values()) - reference_forwards <= 1, counts
    assert_same_training(reference, "reference", cluster.store(), "cudacrashed")
