"""Data-parallel jobs (resources.processes: 2, gloo on the CPU): sharding, exact resume, refusals."""
from __future__ import annotations

import os
import signal

import pytest

from schemas.errors import PermanentError
from storage.file_store import FileStore
from tests.helpers import (assert_bit_equal, assert_same_training, final_state, kill_when, make_spec,
                           mid_epoch_after_two_checkpoints, run_baton, run_reference, start_baton, write_spec)
from workers.distributed import check_same_processes, shard_range, share
from workers.data import EpochBatches

# 2 ranks x 16 = the global batch of BASE_SPEC's 32; 360 training samples: 12 global batches per epoch, the last short
SPEC2 = make_spec(data={"kwargs": {"n_per_class": 150}, "batch_size": 16}, loop={"epochs": 2},
                  checkpoint={"every_steps": 3, "keep_last": 3}, resources={"processes": 2})


def test_every_sample_of_an_epoch_goes_to_exactly_one_rank():
    for n, batch, world in [(360, 16, 2), (100, 16, 3), (33, 8, 4)]:
        epoch = EpochBatches(n, batch * world, seed=5, epoch=1)
        shares = [[share(b, r, world) for b in epoch] for r in range(world)]
        for index, global_batch in enumerate(epoch):
            parts = [shares[r][index] for r in range(world)]
            if len(global_batch) >= world:
                assert sum(parts, []) == global_batch  # contiguous, in rank order, nothing twice
                assert max(map(len, parts)) - min(map(len, parts)) <= 1
            else:  # fewer samples than ranks: every rank still gets one
                assert all(len(p) == 1 and p[0] in global_batch for p in parts)
    assert [list(shard_range(10, r, 3)) for r in range(3)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_a_different_rank_count_is_refused_naming_both():
    check_same_processes(None, 2)
    check_same_processes({"config": {"cpu_threads": 1}}, 1)  # a checkpoint from before the field: one process
    with pytest.raises(PermanentError, match=r"written by 2 process\(es\) and the spec asks for 1"):
        check_same_processes({"config": {"processes": 2}}, 1)
    with pytest.raises(PermanentError, match=r"written by 1 process\(es\) and the spec asks for 2"):
        check_same_processes({"config": {"cpu_threads": 1}}, 2)


def test_one_process_checkpoints_are_unchanged(run_job):
    """processes: 1 (the default) starts no group: no per-rank states, no rank count in the config."""
    result, root, job_id = run_job(make_spec(data={"kwargs": {"n_per_class": 100}}, loop={"epochs": 2}))
    state = final_state(FileStore(root), job_id)
    assert "ranks" not in state and "processes" not in state["config"]


def test_two_ranks_sigkilled_twice_mid_epoch_resume_bit_exact(tmp_path):
    (tmp_path / "ref").mkdir()
    reference = run_reference(tmp_path / "ref", SPEC2)
    spec_path = write_spec(tmp_path, SPEC2)
    store = FileStore(tmp_path / "store")

    first = kill_when(start_baton("run", str(spec_path), "--id", "cut", "--storage", store.url, log=tmp_path / "1.log"),
                      store, "cut", mid_epoch_after_two_checkpoints())
    first_step = first["checkpoints"][-1]["step"]

    def newer_mid_epoch(manifest: dict) -> bool:
        latest = manifest["checkpoints"][-1]
        return latest["step"] > first_step + 1 and latest["kind"] == "step" and latest["batch_in_epoch"] > 0
    kill_when(start_baton("run", str(spec_path), "--id", "cut", "--storage", store.url, log=tmp_path / "2.log"),
              store, "cut", newer_mid_epoch)
    assert "resuming cut from step" in (tmp_path / "2.log").read_text()

    done = run_baton("run", str(spec_path), "--id", "cut", "--storage", store.url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_same_training(reference, "reference", store, "cut")
    ours, theirs = final_state(store, "cut"), final_state(reference, "reference")
    assert len(ours["ranks"]) == 2 and ours["config"]["processes"] == 2
    assert_bit_equal(ours["ranks"], theirs["ranks"], "ranks")  # rank 1's own RNG stream, restored to rank 1
    assert not torch_equal(ours["ranks"][0]["rng"]["torch"], ours["ranks"][1]["rng"]["torch"])  # ranks' dropout differs

    refused = run_baton("run", str(spec_path), "--id", "cut", "--storage", store.url, "--set", "resources.processes=1")
    assert refused.returncode == 2
    assert "resources.processes: job cut runs as 2 process(es); this spec asks for 1" in refused.stdout + refused.stderr


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


def test_a_rank_killed_tears_the_group_down_without_a_hang(tmp_path):
    """SIGKILL rank 1 alone: rank 0 sees the broken collective, names the rank and exits (a worker
    would release the job as a worker loss); nothing is left running."""
    import re
    import time

    from tests.workers.test_ddp_workers import alive

    spec_path = write_spec(tmp_path, make_spec(**{**SPEC2, "loop": {**SPEC2["loop"], "epochs": 40}}))
    log = tmp_path / "run.log"
    proc = start_baton("run", str(spec_path), "--id", "k", "--storage", FileStore(tmp_path / "store").url, log=log)
    deadline = time.monotonic() + 60
    while not re.search(r"epoch 0: step", log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    rank1 = int(re.search(r"ranks 1\.\.1 are pids (\d+)", log.read_text())[1])
    os.kill(rank1, signal.SIGKILL)
    assert proc.wait(timeout=30) == 1
    assert "RankLost: rank 1 killed by SIGKILL" in log.read_text()
    assert not alive(rank1)
