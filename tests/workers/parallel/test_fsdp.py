"""Sharded jobs (resources.strategy: fsdp, 2 gloo ranks on the CPU): units, sharded checkpoints, exact
resume after SIGKILLs and a corrupt shard, agreement with ddp, consolidated weights."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from baton.schemas.errors import PermanentError, SpecError
from baton.schemas.manifest import CheckpointEntry
from baton.schemas.spec import JobSpec
from baton.storage.artifacts import download_checkpoint
from baton.storage.stores.file_store import FileStore
from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt
from baton.workers.parallel.fsdp import shard_units
from baton.workers.parallel.sharded_state import read_own
from baton.workers.training.control import LoopControl

from tests.helpers import (
    REPO,
    assert_bit_equal,
    deterministic_part,
    final_model_bytes,
    kill_when,
    make_spec,
    metrics_rows,
    mid_epoch_after_two_checkpoints,
    read_manifest,
    run_reference,
    start_baton,
    write_spec,
)

# as test_ddp's SPEC2 (2 ranks x 16, slow data so that a kill lands mid-epoch), sharded; no dropout, so
# that the ddp run of the same global batches can be compared with it
FSDP = make_spec(data={"target": "tests.probes:slow_spiral", "kwargs": {"n_per_class": 150, "delay_s": 0.004},
                       "batch_size": 16},
                 model={"kwargs": {"in_features": 2, "hidden": 32, "out_features": 3, "dropout": 0.0}},
                 loop={"epochs": 3}, checkpoint={"every_steps": 3, "keep_last": 3, "min_interval_s": 0},
                 resources={"processes": 2, "strategy": "fsdp"})


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.norm = nn.LayerNorm(4)
        self.act = nn.ReLU()
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def test_units_are_the_blocks_and_tied_weights_go_to_the_root():
    model = Tied()
    assert shard_units(model) == [model.blocks[0], model.blocks[1], model.norm]  # embed and head share a weight
    from baton.workers.training.builtins.gpt import char_transformer

    gpt = char_transformer(vocab=20, block=8, width=16, layers=3, heads=2, dropout=0.0)  # blocks: a Sequential
    assert shard_units(gpt) == [gpt.positions, *gpt.blocks, gpt.norm]
    named = Tied()
    named.shard_units = lambda: [named.blocks[1]]
    assert shard_units(named) == [named.blocks[1]]
    named.shard_units = lambda: [nn.Linear(1, 1)]
    with pytest.raises(PermanentError, match="shard_units\\(\\) must return submodules of the model"):
        shard_units(named)
    nested = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)))
    nested.shard_units = lambda: [nested[0], nested[0][1]]
    with pytest.raises(PermanentError, match="Linear is inside Sequential, another unit; units may not nest"):
        shard_units(nested)


def test_fsdp_refuses_fp16_and_only_fsdp_reshards():
    assert JobSpec.parse(make_spec()).resources.strategy == "ddp"
    assert JobSpec.parse(make_spec(resources={"strategy": "fsdp"})).resources.processes == 1  # a group of one
    with pytest.raises(SpecError, match="only sharded checkpoints .* can be resharded"):
        JobSpec.parse(make_spec(resources={"processes": 2, "reshard": True}))
    with pytest.raises(SpecError, match="fsdp trains in bf16 or fp32"):
        JobSpec.parse(make_spec(resources={"strategy": "fsdp", "processes": 2, "device": "cuda"},
                                loop={"precision": "fp16"}))


def sharded_final(store: FileStore, job_id: str, tmp: Path) -> dict:
    """The final checkpoint, whole: every tensor of the model and optimizer state assembled from the shards
    (equal whole tensors: equal shards), and each rank's own state."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    manifest = read_manifest(store, job_id)
    assert manifest["completed"]
    entry = CheckpointEntry(**manifest["checkpoints"][-1])
    assert entry.files is not None and {Path(f.key).name for f in entry.files} == {
        "metadata", "__0_0.distcp", "__1_0.distcp", "rank-0.pt", "rank-1.pt"}
    directory = download_checkpoint(store, entry, tmp / f"{job_id}-final")
    whole: dict = {}
    _load_state_dict(whole, storage_reader=FileSystemReader(str(directory)), no_dist=True,
                     planner=_EmptyStateDictLoadPlanner())
    assert set(whole) == {"model", "optimizer"} and set(whole["optimizer"]["state"]["0.weight"]) == {
        "exp_avg", "exp_avg_sq", "step"}
    return {"sharded": whole, "ranks": [read_own(directory, rank) for rank in (0, 1)]}


def assert_same_sharded_training(store_a, job_a, store_b, job_b, tmp: Path) -> None:
    a, b = sharded_final(store_a, job_a, tmp), sharded_final(store_b, job_b, tmp)
    assert_bit_equal(a["sharded"], b["sharded"], "sharded")  # model and optimizer, torch.equal per tensor
    for rank in (0, 1):
        for part in ("rng", "progress", "scheduler", "best", "data"):
            assert_bit_equal(a["ranks"][rank][part], b["ranks"][rank][part], f"rank {rank} {part}")
    assert not torch.equal(a["ranks"][0]["rng"]["torch"], a["ranks"][1]["rng"]["torch"])  # each rank its own
    rows_a, rows_b = metrics_rows(store_a, job_a), metrics_rows(store_b, job_b)
    assert [deterministic_part(r) for r in rows_a] == [deterministic_part(r) for r in rows_b]
    assert final_model_bytes(store_a, job_a) == final_model_bytes(store_b, job_b)


@pytest.fixture(scope="module")
def fsdp_reference(tmp_path_factory):
    return run_reference(tmp_path_factory.mktemp("fsdp-reference"), FSDP)


@pytest.mark.slow
def test_sigkilled_twice_and_a_corrupt_shard_resume_bit_exact(tmp_path, fsdp_reference):
    """`baton run` of 2 sharded ranks: SIGKILLed whole mid-epoch; resumed, rank 1 alone SIGKILLed
    mid-epoch (rank 0 names it and exits); then one shard of the latest checkpoint corrupted: the
    whole checkpoint is refused and the one before it resumed. The run ends equal, tensor for
    tensor, to the uninterrupted one, and its consolidated weights load into the plain model in a
    process without torch.distributed."""
    spec_path = write_spec(tmp_path, FSDP)
    store = FileStore(tmp_path / "store")
    run = ["run", str(spec_path), "--id", "cut", "--storage", store.url]

    first = kill_when(start_baton(*run, log=tmp_path / "1.log"), store, "cut", mid_epoch_after_two_checkpoints())
    first_step = first["checkpoints"][-1]["step"]
    assert first["checkpoints"][-1]["files"] is not None

    log = tmp_path / "2.log"
    proc = start_baton(*run, log=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        latest = read_manifest(store, "cut")["checkpoints"][-1]
        if latest["step"] > first_step + 3 and latest["kind"] == "step" and latest["batch_in_epoch"] > 0:
            break
        assert proc.poll() is None, log.read_text()
        time.sleep(0.01)
    rank1 = int(re.search(r"ranks 1\.\.1 are pids (\d+)", log.read_text())[1])
    os.kill(rank1, signal.SIGKILL)
    assert proc.wait(timeout=30) == 1, log.read_text()
    assert f"resuming cut from step {first_step}" in log.read_text()
    assert "RankLost: rank 1 killed by SIGKILL" in log.read_text()

    manifest = read_manifest(store, "cut")
    latest, before = manifest["checkpoints"][-1], manifest["checkpoints"][-2]
    shard = next(f["key"] for f in latest["files"] if f["key"].endswith("__1_0.distcp"))
    path = tmp_path / "store" / shard
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    lines: list[str] = []

    class Logged(LoopControl):
        def log(self, message: str) -> None:
            lines.append(message)

    attempt = manifest["attempt"] + 1
    result = run_attempt(Attempt(JobSpec.parse(FSDP), "cut", attempt, store, allowed_prefixes=("tests",)), AttemptOptions(Logged()))
    assert result.outcome.completed and result.resumed_from_step == before["step"]
    assert any("__1_0.distcp: sha256 does not match the manifest" in line for line in lines), lines
    assert_same_sharded_training(fsdp_reference, "reference", store, "cut", tmp_path)

    weights = tmp_path / "model.safetensors"
    weights.write_bytes(final_model_bytes(store, "cut"))
    check = ("import sys, safetensors.torch, torch.distributed as dist; from baton.workers.training.builtins.models "
             "import mlp; m = mlp(in_features=2, hidden=32, out_features=3, dropout=0.0); "
             "m.load_state_dict(safetensors.torch.load_file(sys.argv[1])); assert not dist.is_initialized(); "
             "print('loaded', sum(p.numel() for p in m.parameters()))")
    loaded = subprocess.run([sys.executable, "-c", check, str(weights)], capture_output=True, text=True, cwd=REPO)
    assert loaded.returncode == 0 and "loaded" in loaded.stdout, loaded.stderr  # strict: every key, full shapes


@pytest.mark.slow
@pytest.mark.quick  # (the quick tier's sharded job: sharded checkpoints)
def test_fsdp_and_ddp_agree_on_every_validation(tmp_path, fsdp_reference):
    """The same global batches under ddp (gradients all-reduced, whole optimizer on each rank) and fsdp
    (reduce-scattered, each rank stepping its shard): only the summation order differs."""
    ddp = run_reference(tmp_path, {**FSDP, "resources": {**FSDP["resources"], "strategy": "ddp"}}, "ddp")
    sharded, replicated = metrics_rows(fsdp_reference, "reference"), metrics_rows(ddp, "ddp")
    assert [r["step"] for r in sharded] == [r["step"] for r in replicated] == [12, 24, 36]
    for a, b in zip(sharded, replicated):
        for key in ("val_loss", "train_loss", "grad_norm"):  # grad_norm: the global norm, over both shards
            assert abs(a[key] - b[key]) <= 1e-3 * abs(b[key]), (key, a, b)
    assert sharded[-1]["train_loss"] < 0.95 * sharded[0]["train_loss"]  # it learns


@pytest.mark.slow
def test_sigterm_stops_every_rank_at_one_step_and_loses_nothing(tmp_path, fsdp_reference):
    """SIGTERM to rank 0 alone (the stop flag carries it to rank 1): both ranks stop at the same step
    and write the one stop checkpoint, whose every rank file is at that step; resumed from it, the
    run ends equal to the uninterrupted one."""
    store = stop_and_resume(tmp_path, FSDP, "term")
    assert_same_sharded_training(fsdp_reference, "reference", store, "term", tmp_path)


@pytest.mark.slow
def test_bf16_with_gradient_accumulation_resumes_bit_exact(tmp_path):
    """bf16 through FSDP's mixed-precision policy, 2 micro-batches per step, clipping on the global
    norm: stopped mid-epoch and resumed, equal to the uninterrupted run tensor for tensor."""
    spec = {**FSDP, "loop": {**FSDP["loop"], "precision": "bf16", "grad_accum_steps": 2, "epochs": 2},
            "checkpoint": {**FSDP["checkpoint"], "every_steps": 2}}
    reference = run_reference(tmp_path / "reference", spec)
    store = stop_and_resume(tmp_path, spec, "bf16")
    assert_same_sharded_training(reference, "reference", store, "bf16", tmp_path)
    rows = metrics_rows(store, "bf16")
    assert [r["step"] for r in rows] == [6, 12]  # 12 global batches a pass, 2 per step
    assert rows[-1]["train_loss"] < rows[0]["train_loss"] and all(0 < r["grad_norm"] < 100 for r in rows)


def stop_and_resume(tmp_path: Path, spec: dict, job_id: str) -> FileStore:
    """``spec`` run by `baton run`, SIGTERMed once a periodic checkpoint is committed: it stops after
    a stop checkpoint whose every rank file is at its step; then resumed from it to the end."""
    spec_path = write_spec(tmp_path, spec)
    store = FileStore(tmp_path / "store")
    log = tmp_path / "run.log"
    proc = start_baton("run", str(spec_path), "--id", job_id, "--storage", store.url, log=log)
    deadline = time.monotonic() + 120
    while not ((m := read_manifest(store, job_id)) and any(e["kind"] == "step" for e in m["checkpoints"])):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 3, log.read_text()  # EXIT_STOPPED: stopped after its checkpoint
    latest = read_manifest(store, job_id)["checkpoints"][-1]
    assert latest["kind"] == "stop" and latest["files"] is not None
    directory = download_checkpoint(store, CheckpointEntry(**latest), tmp_path / "stop")
    assert [read_own(directory, rank)["progress"]["global_step"] for rank in (0, 1)] == [latest["step"]] * 2

    result = run_attempt(Attempt(JobSpec.parse(spec), job_id, read_manifest(store, job_id)["attempt"] + 1, store, allowed_prefixes=("tests",)), AttemptOptions(LoopControl()))
    assert result.outcome.completed and result.resumed_from_step == latest["step"]
    return store


@pytest.mark.slow
def test_ranks_with_uneven_validation_shards_run_the_same_forwards(tmp_path):
    """33 validation samples on 2 ranks in batches of 16: 17 and 16 samples, 2 batches against 1. Every
    forward of a sharded model gathers from every rank, so rank 1 runs its batch again, unscored
    (before, the ranks' collectives crossed: a hang). The scores are those of the whole set: equal
    to ddp's, which scores the same shards without gathering."""
    spec = make_spec(data={"kwargs": {"n_per_class": 55}, "batch_size": 16, "val_fraction": 0.2},
                     model={"kwargs": {"in_features": 2, "hidden": 32, "out_features": 3, "dropout": 0.0}},
                     loop={"epochs": 1}, checkpoint={"every_steps": None}, scheduler={"name": "none"},
                     resources={"processes": 2, "strategy": "fsdp"})
    sharded = metrics_rows(run_reference(tmp_path / "fsdp", spec, "uneven"), "uneven")
    spec["resources"]["strategy"] = "ddp"
    replicated = metrics_rows(run_reference(tmp_path / "ddp", spec, "uneven"), "uneven")
    assert len(sharded) == len(replicated) == 1
    for key in ("val_loss", "val_accuracy"):
        assert abs(sharded[0][key] - replicated[0][key]) <= 1e-3 * abs(replicated[0][key]), (key, sharded, replicated)


@pytest.mark.gpu
def test_a_cuda_shard_is_snapshot_to_pinned_host_memory_while_the_next_step_runs(tmp_path):
    """One NCCL rank (a world of 1) on a GPU: the snapshot of its DTensor shards holds pinned host tensors
    (never copied back to the GPU), equal to the shards at the take after the next forward and backward
    have run over the side-stream copy, and the loop's wait before the optimizer step."""
    from types import SimpleNamespace

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from baton.storage.checkpointing.snapshot import HostSnapshot, storage_key
    from baton.workers.parallel.fsdp import shard_model
    from baton.workers.parallel.sharded_state import sharded_parts

    dist.init_process_group("nccl", store=dist.FileStore(str(tmp_path / "rendezvous"), 1), rank=0, world_size=1)
    try:
        torch.cuda.set_device(0)
        model = shard_model(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8)).cuda(),
                            init_device_mesh("cuda", (1,)), "bf16")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

        def forward_backward():
            optimizer.zero_grad(set_to_none=True)
            model(torch.randn(64, 256, device="cuda")).pow(2).mean().backward()

        forward_backward()
        optimizer.step()
        state = sharded_parts(SimpleNamespace(model=model, optimizer=optimizer))
        expected = {name: t.to_local().detach().cpu().clone() for name, t in state["model"].items()}
        snapshot = HostSnapshot(pin_memory=True)
        copy = snapshot.take(state, {storage_key(t) for t in state["model"].values()})
        forward_backward()  # overlaps the side-stream copy
        snapshot.wait_for_side_copies()  # what the loop does before the optimizer step
        optimizer.step()
        snapshot.copies.wait_all()  # what the background thread does before DCP's save
        for name, tensor in copy["model"].items():
            local = tensor.to_local()
            assert local.device.type == "cpu" and local.is_pinned(), name
            assert torch.equal(local, expected[name]), name
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_two_ranks_on_two_gpus_train_sharded_with_nccl_in_bf16(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    spec = {**FSDP, "loop": {**FSDP["loop"], "precision": "bf16", "epochs": 2},
            "resources": {**FSDP["resources"], "device": "cuda"}}
    store = run_reference(tmp_path, spec, "gpu")
    final = sharded_final(store, "gpu", tmp_path)
    assert final["ranks"][0]["config"]["device_type"] == "cuda" and final["ranks"][1]["rng"]["cuda"]
    assert all(t.dtype == torch.float32 for t in final["sharded"]["model"].values())  # bf16 compute, fp32 masters


@pytest.mark.slow
def test_a_worker_holding_a_sharded_job_sigkilled_the_next_resumes_it_bit_exact(cluster, fsdp_reference, tmp_path):
    """Through `baton worker` processes over S3: the holder's worker process SIGKILLed mid-epoch (its rank
    dies with it); the other worker resumes the job from the sharded checkpoint, and it ends equal to the
    uninterrupted run, tensor for tensor, with no rank left running."""
    from tests.workers.parallel.test_ddp import alive
    from tests.workers.parallel.test_ddp_workers import rank_pids, sigkill_worker_pid_when
    from tests.workers.queue.test_worker_loss import running_at_step, wait_for

    cluster.start_workers(2)
    job = cluster.client.submit(FSDP, "sharded")
    holder = cluster.worker(wait_for(running_at_step(job, 1)).worker)
    ranks = wait_for(lambda: rank_pids(holder), timeout=30)
    committed = sigkill_worker_pid_when(holder, cluster.store(), "sharded", mid_epoch_after_two_checkpoints())
    assert committed["checkpoints"][-1]["files"] is not None
    wait_for(lambda: not any(alive(pid) for pid in ranks), timeout=10)

    final = job.wait(timeout=180, progress=False)
    assert final.state.value == "succeeded", final.error
    assert (final.attempt, final.lost, final.resumed_from) == (2, 1, committed["checkpoints"][-1]["step"])
    assert_same_sharded_training(fsdp_reference, "reference", cluster.store(), "sharded", tmp_path)
    assert not any(alive(pid) for pid in rank_pids(cluster.worker(final.worker)))
