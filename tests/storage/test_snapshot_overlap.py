"""CheckFreq-style snapshots: the parameters' and optimizer state's device-to-host copy overlaps
the next forward/backward on a side stream; everything else is copied in stream order. The CPU
paths run everywhere; the CUDA ones are marked ``gpu``."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from baton.storage.checkpointing.snapshot import HostSnapshot, storage_key
from baton.workers.training.train_state import stable_storages


def _model_and_optimizer(device: str = "cpu"):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _train_step(model, optimizer, device)
    return model, optimizer


def _forward_backward(model, device):
    x, y = torch.randn(32, 8, device=device), torch.randint(0, 3, (32,), device=device)
    nn.functional.cross_entropy(model(x), y).backward()  # a training forward updates BatchNorm's buffers


def _train_step(model, optimizer, device):
    optimizer.zero_grad(set_to_none=True)
    _forward_backward(model, device)
    optimizer.step()


def _state(model, optimizer):
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def _clone(state):
    if isinstance(state, torch.Tensor):
        return state.detach().cpu().clone()
    if isinstance(state, dict):
        return {k: _clone(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_clone(v) for v in state)
    return state


def _assert_equal(a, b):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_equal(x, y)
    else:
        assert a == b


def test_stable_storages_are_the_parameters_and_optimizer_state_not_the_buffers():
    model, optimizer = _model_and_optimizer()
    stable = stable_storages(SimpleNamespace(model=model, optimizer=optimizer))
    assert all(storage_key(p) in stable for p in model.parameters())
    assert all(storage_key(v) in stable for s in optimizer.state.values() for v in s.values())
    assert all(storage_key(b) not in stable for b in model.buffers())  # a forward writes them
    assert all(storage_key(t) in stable for k, t in model.state_dict().items() if "running" not in k and "num_batches" not in k)


def test_on_the_cpu_a_stable_take_is_the_same_synchronous_copy():
    model, optimizer = _model_and_optimizer()
    stable = stable_storages(SimpleNamespace(model=model, optimizer=optimizer))
    snapshot = HostSnapshot(pin_memory=True)  # no CUDA here: pinning is off and nothing overlaps
    expected = _clone(_state(model, optimizer))
    copy = snapshot.take(_state(model, optimizer), stable)
    assert snapshot.copies.side is None and snapshot.copies.main is None
    _train_step(model, optimizer, "cpu")  # the loop moves on at once
    assert snapshot.wait_for_side_copies() == 0.0
    snapshot.copies.wait_all()
    _assert_equal(copy, expected)
    first = copy["model"]["0.weight"].data_ptr()
    assert snapshot.take(_state(model, optimizer), stable)["model"]["0.weight"].data_ptr() == first  # reused


def test_with_overlap_on_cpu_a_thread_copies_the_stable_tensors_while_the_loop_goes_on():
    """A sharded job's snapshot: the parameters and optimizer state are copied by a thread; the
    buffers (BatchNorm's running statistics: a forward writes them) at once. Once the loop has waited
    (before its optimizer step), the copy is the state at the take, whatever the loop did meanwhile."""
    model, optimizer = _model_and_optimizer()
    stable = stable_storages(SimpleNamespace(model=model, optimizer=optimizer))
    snapshot = HostSnapshot(overlap_on_cpu=True)
    expected = _clone(_state(model, optimizer))
    big = torch.randn(20_000_000)  # ~80 MB
    big_then = big.clone()
    copy = snapshot.take({**_state(model, optimizer), "big": big}, stable | {storage_key(big)})
    assert snapshot.copies.side is not None  # a thread copies them
    assert torch.equal(copy["model"]["1.running_mean"], expected["model"]["1.running_mean"])  # not deferred
    model(torch.randn(4, 8))  # a forward, as the loop's next one: writes the running statistics only
    snapshot.wait_for_side_copies()
    assert snapshot.copies.side.query()
    _train_step(model, optimizer, "cpu")  # now the optimizer may step
    big.add_(1.0)
    _assert_equal({k: v for k, v in copy.items() if k != "big"}, expected)
    assert torch.equal(copy["big"], big_then)


@pytest.mark.gpu
def test_side_stream_copy_overlaps_forward_backward_and_is_exact():
    model, optimizer = _model_and_optimizer("cuda")
    stable = stable_storages(SimpleNamespace(model=model, optimizer=optimizer))
    snapshot = HostSnapshot(pin_memory=True)
    for _ in range(3):  # buffers are reused from the second take on
        torch.cuda.synchronize()
        expected = _clone(_state(model, optimizer))
        copy = snapshot.take(_state(model, optimizer), stable)
        assert snapshot.copies.side is not None and snapshot.copies.main is not None
        optimizer.zero_grad(set_to_none=True)
        _forward_backward(model, "cuda")  # overlaps the side copies; writes BatchNorm's buffers
        snapshot.wait_for_side_copies()  # what the loop does before optimizer.step
        optimizer.step()
        snapshot.copies.wait_all()  # what the background thread does before serializing
        assert copy["model"]["0.weight"].is_pinned()
        _assert_equal(copy, expected)


@pytest.mark.gpu
def test_checkpointing_every_step_on_cuda_does_not_change_training(tmp_path):
    from baton.schemas.spec import JobSpec
    from baton.storage.stores.file_store import FileStore
    from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt

    from tests.helpers import assert_same_training, make_spec
    from tests.workers.conftest import Quiet

    store = FileStore(tmp_path)
    for job, every in (("none", None), ("each", 1)):
        spec = JobSpec.parse(make_spec(loop={"epochs": 2}, checkpoint={"every_steps": every},
                                       resources={"device": "cuda", "cpu_threads": 1}))
        assert run_attempt(Attempt(spec, job, 1, store), AttemptOptions(Quiet())).outcome.completed
    assert_same_training(store, "none", store, "each")


@pytest.mark.parametrize("load, threads", [(50.0, 1), (0.0, 2), (float(os.cpu_count() or 1), 2)])
def test_host_copy_uses_one_thread_on_busy_cores_and_restores_the_training_count(monkeypatch, load, threads):
    import baton.storage.checkpointing.snapshot as snapshot_module

    monkeypatch.setattr(snapshot_module.os, "getloadavg", lambda: (load, load, load))
    seen = []
    original = snapshot_module.HostSnapshot._copy_tensor
    monkeypatch.setattr(snapshot_module.HostSnapshot, "_copy_tensor",
                        lambda self, t, path: seen.append(torch.get_num_threads()) or original(self, t, path))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        HostSnapshot().take({"w": torch.ones(4), "b": [torch.zeros(2)]})
        assert seen == [threads] * 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_job_using_every_core_of_an_idle_machine_is_not_taken_for_a_busy_one():
    """The load average counts the training's own threads: 2 threads on 2 idle cores keep the load
    near 2, which must leave the copy its 2 threads; a whole runnable task more means contention."""
    from baton.storage.checkpointing.snapshot import machine_busy

    assert not machine_busy(load=2.0, cores=2) and not machine_busy(load=2.6, cores=2)
    assert machine_busy(load=3.0, cores=2) and machine_busy(load=7.0, cores=2)
    assert not machine_busy(load=0.3, cores=2)


def test_a_host_state_copied_from_a_background_thread_leaves_the_training_thread_count_alone(monkeypatch):
    """An in-memory copy's publication on CUDA: the pinned staging copy moved into the slot's buffers
    by a thread, while the loop trains with its own intra-op thread count."""
    import baton.storage.checkpointing.snapshot as snapshot_module

    monkeypatch.setattr(snapshot_module.os, "getloadavg", lambda: (50.0, 50.0, 50.0))  # take() would use 1
    model, optimizer = _model_and_optimizer()
    expected = _clone(_state(model, optimizer))
    snapshot = HostSnapshot()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []
        original = snapshot_module.HostSnapshot._copy_tensor
        monkeypatch.setattr(snapshot_module.HostSnapshot, "_copy_tensor",
                            lambda self, t, path: seen.append(torch.get_num_threads()) or original(self, t, path))
        copy = snapshot.copy_host(_state(model, optimizer))
        assert seen and set(seen) == {2}
    finally:
        torch.set_num_threads(before)
    _assert_equal(copy, expected)
    first = copy["model"]["0.weight"].data_ptr()
    _train_step(model, optimizer, "cpu")
    again = snapshot.copy_host(_state(model, optimizer))
    assert again["model"]["0.weight"].data_ptr() == first  # its buffers reused
    _assert_equal(again, _clone(_state(model, optimizer)))
