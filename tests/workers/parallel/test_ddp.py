"""Data-parallel jobs (resources.processes: 2, gloo on the CPU): sharding, exact resume, refusals."""
from __future__ import annotations

import os
import re
import signal
import time

import pytest
import torch

from baton.schemas.errors import PermanentError, SpecError
from baton.schemas.spec import JobSpec
from baton.storage.stores.file_store import FileStore
from baton.storage.layout import JobPaths
from baton.workers.attempt.local import register_spec
from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt
from baton.workers.parallel.distributed import check_same_processes
from baton.workers.training.control import LoopControl
from baton.workers.training.data import EpochBatches
from baton.workers.training.sharding import shard_range, share

from tests.helpers import (
    assert_bit_equal,
    assert_same_training,
    baton_env,
    final_state,
    kill_when,
    make_spec,
    mid_epoch_after_two_checkpoints,
    read_manifest,
    start_baton,
    write_spec,
)

# 2 ranks x 16 = the global batch of BASE_SPEC's 32; 360 training samples: 12 global batches per epoch, the
# last short; slow data (~0.07 s per step) so that a kill lands mid-epoch
SPEC2 = make_spec(data={"target": "tests.probes:slow_spiral", "kwargs": {"n_per_class": 150, "delay_s": 0.004},
                        "batch_size": 16},
                  loop={"epochs": 3}, checkpoint={"every_steps": 3, "keep_last": 3}, resources={"processes": 2})


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


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_two_ranks_sigkilled_twice_mid_epoch_resume_bit_exact(tmp_path, ddp_reference):
    """`baton run` of 2 ranks: first the whole run SIGKILLed mid-epoch (rank 0 and rank 1 at once),
    then, resumed, rank 1 alone SIGKILLed mid-epoch: rank 0 sees the broken collective, names the
    rank and exits by itself (no hang; a worker would release the job as a worker loss), leaving
    nothing running. Resumed again, it ends equal to an uninterrupted 2-rank run on every tensor.
    The ranks' private directory the SIGKILLed run could not remove is removed by the next run."""
    spec_path = write_spec(tmp_path, SPEC2)
    store = FileStore(tmp_path / "store")
    (tmp_path / "tmp").mkdir()
    env = baton_env(TMPDIR=str(tmp_path / "tmp"))

    first = kill_when(start_baton("run", str(spec_path), "--id", "cut", "--storage", store.url, env=env,
                                  log=tmp_path / "1.log"), store, "cut", mid_epoch_after_two_checkpoints())
    first_step = first["checkpoints"][-1]["step"]
    left = list((tmp_path / "tmp").glob("baton-ranks-*"))
    assert len(left) == 1, left  # rank 0 was SIGKILLed: it removed nothing

    log = tmp_path / "2.log"
    proc = start_baton("run", str(spec_path), "--id", "cut", "--storage", store.url, env=env, log=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        latest = read_manifest(store, "cut")["checkpoints"][-1]
        if latest["step"] > first_step + 1 and latest["kind"] == "step" and latest["batch_in_epoch"] > 0:
            break
        assert proc.poll() is None, log.read_text()
        time.sleep(0.01)
    rank1 = int(re.search(r"ranks 1\.\.1 are pids (\d+)", log.read_text())[1])
    assert not left[0].exists(), "the SIGKILLed run's rendezvous directory is still there"
    os.kill(rank1, signal.SIGKILL)
    assert proc.wait(timeout=30) == 1
    assert "resuming cut from step" in log.read_text() and "RankLost: rank 1 killed by SIGKILL" in log.read_text()
    assert not alive(rank1)

    attempt = read_manifest(store, "cut")["attempt"] + 1  # the last resume in this process, as `baton run` would
    assert run_attempt(Attempt(JobSpec.parse(SPEC2), "cut", attempt, store, allowed_prefixes=("tests",)), AttemptOptions(LoopControl())).outcome.completed
    assert_same_training(ddp_reference, "reference", store, "cut")
    ours, theirs = final_state(store, "cut"), final_state(ddp_reference, "reference")
    assert len(ours["ranks"]) == 2 and ours["config"]["processes"] == 2
    assert_bit_equal(ours["ranks"], theirs["ranks"], "ranks")  # rank 1's own RNG stream, restored to rank 1
    assert not torch.equal(ours["ranks"][0]["rng"]["torch"], ours["ranks"][1]["rng"]["torch"])  # ranks' dropout differs

    one = JobSpec.parse(make_spec(**{**SPEC2, "resources": {**SPEC2["resources"], "processes": 1}}))
    with pytest.raises(SpecError, match=r"resources.processes: job cut runs as 2 process\(es\); this spec asks for 1"):
        register_spec(store, JobPaths("cut"), one)


def test_two_ranks_follow_the_loss_curve_of_one_rank_at_twice_the_batch(run_job):
    """Same global batches (2 x 16 vs 1 x 32, one shuffle), DDP averages the two half-batch
    gradients: without dropout the only difference left is floating-point summation order, so
    every epoch's train_loss, val_loss and val_accuracy agree to 1e-6 relative (seen: at most 5e-8),
    while the curve itself moves by far more (train_loss falls by over 5% in 4 epochs). With dropout
    the ranks draw different masks, so the curves differ by dropout noise: see bench/ddp.py."""
    spec = dict(data={"kwargs": {"n_per_class": 150}}, loop={"epochs": 4}, checkpoint={"every_steps": 100},
                model={"kwargs": {"in_features": 2, "hidden": 32, "out_features": 3, "dropout": 0.0}})
    _, root1, one = run_job(make_spec(**spec))
    _, root2, two = run_job(make_spec(**{**spec, "data": {**spec["data"], "batch_size": 16}},
                                      resources={"processes": 2}))
    from tests.workers.conftest import read_rows

    assert "ranks" not in final_state(FileStore(root1), one)  # processes: 1 starts no group: checkpoints as before
    assert "processes" not in final_state(FileStore(root1), one)["config"]
    rows1, rows2 = read_rows(root1, one), read_rows(root2, two)
    assert [r["step"] for r in rows1] == [r["step"] for r in rows2] == [12, 24, 36, 48]
    for a, b in zip(rows1, rows2):
        for key in ("train_loss", "val_loss", "val_accuracy"):
            assert abs(a[key] - b[key]) <= 1e-6 * abs(a[key]), (key, a, b)
        assert a["lr"] == pytest.approx(b["lr"], rel=1e-12)  # the schedule counts global steps
    assert rows1[-1]["train_loss"] < 0.95 * rows1[0]["train_loss"]


def test_spec_field_bounds_and_what_n_ranks_refuse():
    assert JobSpec.parse(make_spec()).resources.processes == 1
    with pytest.raises(SpecError, match="resources.processes"):
        JobSpec.parse(make_spec(resources={"processes": 0}))
    with pytest.raises(SpecError, match="loop.nonfinite: skip is not supported with resources.processes > 1"):
        JobSpec.parse(make_spec(resources={"processes": 2}, loop={"nonfinite": "skip"}))


@pytest.mark.gpu
def test_two_ranks_on_two_gpus_train_with_nccl(run_job):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    spec = make_spec(data={"kwargs": {"n_per_class": 150}, "batch_size": 16}, loop={"epochs": 2},
                     resources={"device": "cuda", "processes": 2, "cpu_threads": 1})
    result, root, job_id = run_job(spec)
    state = final_state(FileStore(root), job_id)
    assert result.outcome.completed and len(state["ranks"]) == 2 and state["config"]["device_type"] == "cuda"
    assert state["ranks"][1]["rng"]["cuda"]  # each rank's CUDA generators travel with the checkpoint


def test_a_rank_that_fails_or_lags_before_the_group_forms_is_told_apart_without_the_watchdog():
    """Rank 0 joins the group only once every rank has reached it: a rank whose spec (or the job's
    code) fails before then is RankFailed at once (the job fails), one that does not come in time
    RankLost (a worker loss); neither waits for the watchdog, which would end the worker process. A rank
    the given start cannot fork (a follower's forkserver) starts as a new interpreter."""
    from baton.schemas.messages import GroupOrder
    from baton.storage import owned_dirs
    from baton.workers.parallel import rendezvous
    from baton.workers.parallel.launcher import RANKS_PREFIX, Meeting, RankFailed, RankLost, Ranks

    # a spec the ranks cannot take (as a node whose baton reads it otherwise would): a SpecError on rank 1
    broken = GroupOrder.model_construct(spec={"name": "broken"}, job_id="broken", attempt=1, storage_url="file:///dev/null",
                                        world_size=2, cpu_threads=1, device_type="cpu", allowed_prefixes=(),
                                        resume_key=None, resume_sha256=None, resume_dir=None, resume_entry=None)

    def ranks(start=None) -> Ranks:
        directory, secret = owned_dirs.make(RANKS_PREFIX), rendezvous.new_secret()
        meeting = Meeting(secret, rendezvous.open_store(directory, 2, 60, secret))
        return Ranks(broken, range(1, 2), meeting, lines.append, directory, on_hang=hung.append, start=start)

    def cannot_fork(place, secret):  # a follower's forkserver with no descriptor left (EMFILE)
        raise OSError(24, "Too many open files")

    hung, lines = [], []
    failing = ranks()
    try:
        with pytest.raises(RankFailed, match="rank 1 of 2: SpecError: invalid job spec") as failed:
            failing.wait_until_ready(timeout_s=120)
        assert failed.value.origin == "on rank 1 of 2" and "SpecError" in failed.value.traceback
    finally:
        failing.kill()
    lagging = ranks()
    try:  # no rank starts Python and imports torch within 10 ms
        with pytest.raises(RankLost, match=r"rank\(s\) 1 did not reach the group within 0s"):
            lagging.wait_until_ready(timeout_s=0.01)
    finally:
        lagging.kill()
    unforked = ranks(start=cannot_fork)  # started as a new interpreter instead, and the log says why
    try:
        with pytest.raises(RankFailed, match="rank 1 of 2: SpecError: invalid job spec"):
            unforked.wait_until_ready(timeout_s=120)
    finally:
        unforked.kill()
    assert hung == [] and [p.poll() for p in failing.procs + lagging.procs + unforked.procs] == [65, -signal.SIGKILL, 65]
    assert ("data-parallel: rank 1 could not be forked here (OSError(24, 'Too many open files')); it starts as a new "
            "interpreter") in lines


@pytest.mark.slow
def test_ranks_on_the_cpu_share_the_machines_cores_when_the_spec_sets_no_threads(tmp_path):
    """Each rank taking every core made 2 ranks on 2 cores contend (35 s against 24 s with 1 thread each)."""
    import subprocess
    import sys

    from tests.helpers import run_baton

    cores = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                               capture_output=True, text=True, check=True).stdout)
    spec = make_spec(data={"target": "builtin:spiral", "kwargs": {"n_per_class": 60}, "batch_size": 16},
                     loop={"epochs": 1}, scheduler={"name": "none"}, checkpoint={"every_steps": None},
                     resources={"processes": 2, "device": "cpu", "cpu_threads": None})
    url = f"file://{tmp_path / 'store'}"
    done = run_baton("run", str(write_spec(tmp_path, spec)), "--id", "shared", "--storage", url)
    assert done.returncode == 0, done.stdout + done.stderr
    store = FileStore(tmp_path / "store")
    latest = read_manifest(store, "shared")["checkpoints"][-1]
    state = torch.load(tmp_path / "store" / latest["key"], weights_only=True)
    assert state["config"]["cpu_threads"] == max(1, cores // 2)
