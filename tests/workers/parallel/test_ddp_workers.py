"""A 2-rank job through real `baton worker` processes: the holder SIGKILLed (its worker process
alone: the ranks must die with it), then the next holder SIGTERMed (all ranks stop at one step,
one checkpoint, release), then the third holder's rank 1 alone SIGKILLed (rank 0 must release the
job as a worker loss, not fail it). It ends bit-identical to `baton run`, with no rank process
left behind."""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.helpers import assert_bit_equal, assert_same_training, final_state, read_manifest
from tests.workers.parallel.test_ddp import SPEC2, alive
from tests.workers.queue.test_worker_loss import running_at_step, wait_for

pytestmark = pytest.mark.slow

SPEC = SPEC2  # 2 ranks, slow data, 3 epochs of 12 steps, a checkpoint every 3 steps


def rank_pids(worker) -> list[int]:
    """The PIDs of the ranks 1..N-1 the worker's latest attempt started (from its log)."""
    found = re.findall(r"ranks 1\.\.\d+ are pids ([\d, ]+)", worker.log())
    return [int(p) for p in found[-1].split(",")] if found else []


def sigkill_worker_pid_when(worker, store, job_id: str, ready) -> dict:
    """SIGKILL the worker's own process (not its process group) once ``ready(manifest)`` holds,
    checked with the whole group frozen so that what is checked is what the resume will see."""
    deadline, manifest = time.monotonic() + 120, None
    while time.monotonic() < deadline:
        manifest = read_manifest(store, job_id)
        if manifest and ready(manifest):
            os.killpg(worker.proc.pid, signal.SIGSTOP)
            manifest = read_manifest(store, job_id)
            if manifest and ready(manifest):
                worker.proc.send_signal(signal.SIGKILL)
                worker.proc.wait()
                try:
                    os.killpg(worker.proc.pid, signal.SIGCONT)  # the ranks, frozen too, must now die by themselves
                except ProcessLookupError:
                    pass  # a worker without child ranks: nothing of its group is left
                return manifest
            os.killpg(worker.proc.pid, signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"kill condition never held; the last manifest read: {manifest}\n{worker.log()}")


@pytest.mark.slow
def test_two_ranks_survive_sigkill_then_sigterm_on_workers_bit_exact_without_orphans(cluster, ddp_reference):
    reference = ddp_reference
    cluster.start_workers(3)  # the third takes the job after the second holder's SIGTERM (all started first:
    job = cluster.client.submit(SPEC, "ddp")  # a worker started meanwhile could find the job near its end)
    holder = cluster.worker(wait_for(running_at_step(job, 1)).worker)
    first_ranks = wait_for(lambda: rank_pids(holder), timeout=30)
    assert all(Path(f"/proc/{pid}/comm").read_text().strip() == "baton-rank" for pid in first_ranks)  # forked ahead

    def mid_epoch(manifest: dict) -> bool:
        latest = manifest["checkpoints"][-1] if manifest["checkpoints"] else None
        return latest is not None and latest["kind"] == "step" and latest["batch_in_epoch"] > 0
    committed = sigkill_worker_pid_when(holder, cluster.store(), "ddp", mid_epoch)
    wait_for(lambda: not any(alive(pid) for pid in first_ranks), timeout=10)  # died with their worker (PDEATHSIG)

    resumed_at = committed["checkpoints"][-1]["step"]
    second = wait_for(lambda: (s := job.status()).attempt == 2 and s.state.value == "running"
                      and (s.step or 0) >= resumed_at + 2 and s, timeout=90)
    second_holder = cluster.worker(second.worker)
    second_ranks = wait_for(lambda: rank_pids(second_holder), timeout=30)
    assert second_ranks and second_holder is not holder
    second_holder.signal(signal.SIGTERM, group=False)  # rank 0 only: the stop flag carries it to rank 1

    assert second_holder.proc.wait(timeout=60) == 0
    stopped = re.search(r"job ddp: stopped at step (\d+) after a committed checkpoint \(preempted\)", second_holder.log())
    assert stopped  # one stop checkpoint, nothing trained lost
    assert not any(alive(pid) for pid in second_ranks)

    third = wait_for(lambda: (s := job.status()).attempt == 3 and s.state.value == "running"
                     and (s.step or 0) >= int(stopped[1]) + 1 and s, timeout=90)
    assert third.resumed_from == int(stopped[1])
    third_holder = cluster.worker(third.worker)
    third_ranks = wait_for(lambda: (pids := rank_pids(third_holder)) and pids != second_ranks and pids, timeout=30)
    os.kill(third_ranks[0], signal.SIGKILL)  # one rank lost: the group is torn down, the job given back

    final = job.wait(timeout=180, progress=False)
    assert final.state.value == "succeeded", final.error
    assert (final.attempt, final.lost) == (4, 2)  # the holder's SIGKILL and the rank's: worker losses
    assert re.search(r"rank 1 killed by SIGKILL.*released as a worker loss", third_holder.log())
    assert not any(alive(pid) for pid in first_ranks + second_ranks + third_ranks
                   + rank_pids(cluster.worker(final.worker)))

    assert_same_training(reference, "reference", cluster.store(), "ddp")
    assert_bit_equal(final_state(cluster.store(), "ddp")["ranks"], final_state(reference, "reference")["ranks"], "ranks")
