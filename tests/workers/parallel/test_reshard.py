"""A sharded job resumed on another number of ranks (resources.reshard): 2 gloo ranks stopped mid-epoch,
resumed on 1. The state loads exact, the interrupted epoch's samples are each served once, the loss
continues, and the run says it is not bit-exact."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
import torch

from baton.schemas.errors import PermanentError
from baton.schemas.manifest import CheckpointEntry
from baton.schemas.spec import JobSpec
from baton.storage.artifacts import download_checkpoint
from baton.storage.stores.file_store import FileStore
from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt
from baton.workers.parallel.reshard import progress_for, restore_resharded
from baton.workers.training import train_state
from baton.workers.training.components import build_components
from baton.workers.training.control import LoopControl
from baton.workers.training.data import EpochBatches, split_indices
from baton.workers.training.progress import BestTracker, Progress

from tests.helpers import (
    REPO,
    assert_bit_equal,
    baton_env,
    final_model_bytes,
    make_spec,
    metrics_rows,
    read_manifest,
    run_baton,
    run_reference,
    start_baton,
    write_spec,
)

CPU = torch.device("cpu")


def sharded(processes: int, served: Path, **resources) -> dict:
    """2 epochs of 360 training samples in global batches of 16 x ranks, onecycle per step (refit when
    resharded), each sample's index recorded as it is served."""
    return make_spec(data={"target": "tests.probes:served_spiral", "batch_size": 16,
                           "kwargs": {"n_per_class": 150, "delay_s": 0.004, "served_dir": str(served)}},
                     model={"kwargs": {"in_features": 2, "hidden": 32, "out_features": 3, "dropout": 0.0}},
                     loop={"epochs": 2}, checkpoint={"every_steps": 3, "keep_last": 3},
                     resources={"processes": processes, "strategy": "fsdp", **resources})


def test_an_offset_pass_serves_the_rest_of_the_order_in_new_batches():
    whole = [i for batch in EpochBatches(50, 8, seed=3, epoch=1) for i in batch]
    rest = list(EpochBatches(50, 5, seed=3, epoch=1, offset=24))
    assert [i for batch in rest for i in batch] == whole[24:]
    assert [len(b) for b in rest] == [5, 5, 5, 5, 5, 1]
    assert [i for b in EpochBatches(50, 5, seed=3, epoch=1, start=2, offset=24) for i in b] == whole[34:]


def test_the_position_becomes_samples_consumed_and_the_loss_sums_go_to_rank_0():
    old = [Progress(epoch=1, batch_in_epoch=4, global_step=16, epoch_loss_sum=s, epoch_samples=64,
                    epoch_grad_norm_sum=2.5, epoch_steps=4) for s in (10.0, 12.0)]
    owns = [{"progress": p.state_dict()} for p in old]
    first = progress_for(owns, 0, 360, 16)  # 4 global batches of 2 x 16
    assert (first.epoch, first.batch_in_epoch, first.epoch_sample_offset, first.global_step) == (1, 0, 128, 16)
    assert (first.epoch_loss_sum, first.epoch_samples, first.epoch_grad_norm_sum) == (22.0, 128, 2.5)
    other = progress_for(owns, 2, 360, 16)
    assert (other.epoch_sample_offset, other.epoch_loss_sum, other.epoch_samples) == (128, 0.0, 0)
    resumed = Progress(epoch=1, batch_in_epoch=3, epoch_sample_offset=128)
    assert progress_for([{"progress": resumed.state_dict()}], 0, 360, 16).epoch_sample_offset == 176
    resumed.start_next_pass()
    assert (resumed.epoch, resumed.epoch_sample_offset) == (2, 0)


def parts_for(processes: int, **sections):
    spec = make_spec(resources={"processes": processes, "strategy": "fsdp", "reshard": True}, **sections)
    return build_components(JobSpec.parse(spec), CPU, ("tests",), 0, processes)


def steps(parts, times: int) -> float:
    """``times`` optimizer steps, each followed by the schedule's; the learning rate after them."""
    for _ in range(times):
        parts.optimizer.step()
        parts.scheduler.step()
    return parts.optimizer.param_groups[0]["lr"]


def resharded(new, old, epoch: int, batch_in_epoch: int, old_world: int, step: Optional[int] = None) -> Progress:
    """``old``'s state at (epoch, batch_in_epoch, step: by default its schedule's) written by ``old_world``
    ranks, loaded into ``new`` as a resharded resume does (the optimizer as DCP would, the rest from rank files)."""
    at = Progress(epoch=epoch, batch_in_epoch=batch_in_epoch, global_step=step or old.scheduler.last_epoch)
    own = train_state.capture(old, at, BestTracker("val_loss", "min"), [], 1, weights=False)
    own["config"]["processes"], own["metrics"] = old_world, []
    new.optimizer.load_state_dict(old.optimizer.state_dict())
    train_state.restore_loop_state(new, own)
    return restore_resharded(new, 0, [own] * old_world)


def test_a_per_step_schedule_is_refit_where_it_was_and_ends_with_the_run():
    """onecycle over 3 epochs, saved by 2 ranks at step 16 of 36 (12 global batches of 64 a pass), resumed
    on 1 rank (23 batches of 32 a pass): the learning rate continues from where it was, and the
    rebuilt schedule lasts exactly the steps left, ending where the saved one would have."""
    old, new = parts_for(2), parts_for(1)
    before = steps(old, 15)
    steps(old, 1)
    resharded(new, old, 1, 4, 2)
    refit_lr, after = new.optimizer.param_groups[0]["lr"], steps(old, 1)
    assert after < refit_lr < before  # annealing: between the saved schedule's steps 15 and 17
    left = -(-(720 - 256) // 32) + 23  # the rest of pass 2, then pass 3
    assert new.total_steps == 16 + left
    # the last step's learning rate (the schedule's floor) is the saved schedule's last, then one step more
    # ends it: OneCycleLR raises if stepped past its total
    assert steps(new, left - 1) == pytest.approx(steps(old, 35 - 17), rel=1e-9)
    steps(new, 1)
    with pytest.raises(ValueError, match="Tried to step"):
        steps(new, 1)


def test_a_second_reshard_and_a_plain_resume_after_one_keep_the_schedule():
    """2 -> 1 rank at step 16, then 1 -> 2 at step 34: the schedule refit the first time is where the
    second starts from (its length travels in the checkpoint), so the learning rate goes on smoothly and
    still ends with the run. A resume on the same count after a reshard rebuilds the refit schedule,
    not the spec's: a warmup_cosine (a LambdaLR, whose length its state does not hold) continues exactly."""
    two, one, again = parts_for(2), parts_for(1), parts_for(2)
    steps(two, 16)
    resharded(one, two, 1, 4, 2)
    before = steps(one, 17)  # step 33: the rest of pass 2 was 15 batches of 32, then 2 of pass 3
    steps(one, 1)
    resharded(again, one, 2, 3, 1, step=34)
    after = steps(one, 1)
    assert after <= again.optimizer.param_groups[0]["lr"] <= before  # within the saved schedule's steps 33 to 35
    left = again.total_steps - 34
    assert left == 12 - 2  # pass 3 at 2 ranks: 12 batches of 64, 3 x 32 samples of it consumed
    steps(again, left)
    with pytest.raises(ValueError, match="Tried to step"):
        steps(again, 1)

    cosine = {"scheduler": {"name": "warmup_cosine", "warmup_fraction": 0.1}}
    two, one, resumed = parts_for(2, **cosine), parts_for(1, **cosine), parts_for(1, **cosine)
    steps(two, 16)
    resharded(one, two, 1, 4, 2)
    steps(one, 5)
    own = train_state.capture(one, Progress(epoch=1, global_step=21), BestTracker("val_loss", "min"), [], 1,
                              weights=False)
    own["metrics"] = []
    resumed.optimizer.load_state_dict(one.optimizer.state_dict())
    train_state.restore_loop_state(resumed, own)
    assert resumed.schedule_total == one.schedule_total != two.schedule_total
    assert steps(resumed, 7) == steps(one, 7)  # the same schedule, bit for bit


def test_an_absolute_warmup_keeps_its_steps_and_a_finished_run_is_left_alone():
    warm = {"scheduler": {"name": "warmup_cosine", "warmup_steps": 10}}
    two, one = parts_for(2, **warm), parts_for(1, **warm)
    steps(two, 5)
    lr = two.optimizer.param_groups[0]["lr"]
    resharded(one, two, 0, 5, 2)
    assert one.scheduler.last_epoch == 5 and one.optimizer.param_groups[0]["lr"] == pytest.approx(lr)
    two, one = parts_for(2), parts_for(1)
    steps(two, 36)  # the last epoch's checkpoint: nothing left to schedule
    resharded(one, two, 3, 0, 2)
    assert one.total_steps == 36 and one.scheduler.last_epoch == 36


LOAD_ON_ONE_RANK = """
import json, sys, torch, torch.distributed as dist
from pathlib import Path
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from baton.schemas.spec import JobSpec
from baton.workers.parallel import sharded_state
from baton.workers.parallel.fsdp import shard_model
from baton.workers.training.components import build_components

spec = JobSpec.parse(json.loads(sys.argv[1]))
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[3], 1), rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
parts = build_components(spec, torch.device("cpu"), ("tests",),
                         prepare_model=lambda model: shard_model(model, mesh, spec.loop.precision))
progress, best, rows = sharded_state.restore(parts, Path(sys.argv[2]), 0, 1, None)
model, optimizer = get_state_dict(parts.model, parts.optimizer, options=StateDictOptions(full_state_dict=True))
torch.save({"model": model, "optimizer": optimizer, "progress": progress.state_dict()}, sys.argv[4])
dist.destroy_process_group()
"""


def whole_checkpoint(directory: Path) -> dict:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    whole: dict = {}
    _load_state_dict(whole, storage_reader=FileSystemReader(str(directory)), no_dist=True,
                     planner=_EmptyStateDictLoadPlanner())
    return whole


def served(directory: Path) -> list[int]:
    """Every index the processes that wrote ``directory``'s records served, rank by rank, which are then removed."""
    indices = []
    for record in sorted(directory.glob("served-*")):
        indices.extend(int(line) for line in record.read_text().split())
        record.unlink()
    return indices


@pytest.mark.slow
def test_two_ranks_stopped_mid_epoch_resume_resharded_on_one(tmp_path):
    """`baton run` of 2 sharded ranks, SIGTERMed mid-epoch (a stop checkpoint of 2 shards); run again
    with 1 rank: refused without resources.reshard, then resharded with it. The state DCP loads on one
    rank equals the 2-rank checkpoint's, tensor for tensor; each training sample of the interrupted
    epoch is served once (those before the stop by the 2 ranks, the rest by the 1); the validation
    losses continue those of the uninterrupted 2-rank run (within 5%: the global batches after the
    stop are half as large); the manifest, the report and the log say it is resharded."""
    (tmp_path / "served").mkdir()
    (tmp_path / "reference-served").mkdir()
    two, one = sharded(2, tmp_path / "served"), sharded(1, tmp_path / "served", reshard=True)
    store = FileStore(tmp_path / "store")
    log = tmp_path / "run.log"
    proc = start_baton("run", str(write_spec(tmp_path, two, "two.yaml")), "--id", "re", "--storage", store.url, log=log)
    deadline = time.monotonic() + 120
    while not ((m := read_manifest(store, "re")) and any(e["kind"] == "step" for e in m["checkpoints"])):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 3, log.read_text()
    stop = read_manifest(store, "re")["checkpoints"][-1]
    assert stop["kind"] == "stop" and stop["epoch"] == 0 and 0 < stop["batch_in_epoch"] < 12, stop
    before = served(tmp_path / "served")
    assert len(before) == stop["batch_in_epoch"] * 32  # 2 ranks x 16, no validation yet

    refused = run_baton("run", str(write_spec(tmp_path, sharded(1, tmp_path / "served"), "plain.yaml")), "--id", "re",
                        "--storage", store.url)
    assert refused.returncode == 2 and "set resources.reshard: true" in refused.stderr + refused.stdout, refused
    with pytest.raises(PermanentError, match="written by 2 rank\\(s\\) and the spec asks for 1.*resources.reshard: true"):
        run_attempt(Attempt(JobSpec.parse(sharded(1, tmp_path / "served")), "re", read_manifest(store, "re")["attempt"] + 1, store, allowed_prefixes=("tests",)), AttemptOptions(LoopControl()))

    directory = download_checkpoint(store, CheckpointEntry(**stop), tmp_path / "stop")
    loaded_path = tmp_path / "loaded.pt"
    loaded = subprocess.run([sys.executable, "-c", LOAD_ON_ONE_RANK, json.dumps(one), str(directory),
                             str(tmp_path / "rendezvous"), str(loaded_path)], capture_output=True, text=True, cwd=REPO,
                            env=baton_env())
    assert loaded.returncode == 0, loaded.stderr
    assert not list((tmp_path / "served").glob("served-*"))  # restoring serves nothing
    on_one, saved = torch.load(loaded_path, weights_only=True), whole_checkpoint(directory)
    assert_bit_equal(saved["model"], on_one["model"], "model")
    assert_bit_equal(saved["optimizer"]["state"], on_one["optimizer"]["state"], "optimizer state")
    assert on_one["progress"]["epoch_sample_offset"] == stop["batch_in_epoch"] * 32

    result = run_baton("run", str(write_spec(tmp_path, one, "one.yaml")), "--id", "re", "--storage", store.url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"resharded from 2 to 1 rank(s) at step {stop['step']}: not bit-exact" in result.stdout
    after = served(tmp_path / "served")
    train, _ = split_indices(450, 0.2, 11)
    rest = after[:len(train) - len(before)]
    assert sorted(before + rest) == sorted(train)  # each once: none skipped, none twice

    manifest = read_manifest(store, "re")
    assert manifest["completed"] and manifest["reshards"] == [
        {"step": stop["step"], "from_ranks": 2, "to_ranks": 1, "attempt": manifest["attempt"]}]
    report = json.loads(store.get_bytes(manifest["final"]["report"]["key"]))
    assert report["resharded"] == [f"resharded from 2 to 1 rank(s) at step {stop['step']}: not bit-exact with a "
                                   "2-rank run"] and report["resharded"][0] in report["note"]

    reference = metrics_rows(run_reference(tmp_path / "reference", sharded(2, tmp_path / "reference-served")),
                             "reference")
    rows = metrics_rows(store, "re")
    assert [r["epoch"] for r in rows] == [r["epoch"] for r in reference] == [1, 2]
    for ours, theirs in zip(rows, reference):
        assert abs(ours["val_loss"] - theirs["val_loss"]) <= 0.05 * theirs["val_loss"], (ours, theirs)
    assert rows[-1]["val_loss"] < rows[0]["val_loss"]  # it goes on learning
    assert final_model_bytes(store, "re")  # consolidated from the 1-rank shards
