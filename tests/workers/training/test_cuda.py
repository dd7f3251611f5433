"""The CUDA paths: CUDA RNG in checkpoints, pinned-memory snapshots, fp16 with a GradScaler.
Marked ``gpu``: skipped without a CUDA device."""
from __future__ import annotations

import pytest
import torch

from baton.schemas.spec import JobSpec
from baton.storage.stores.file_store import FileStore
from baton.storage.checkpointing.snapshot import HostSnapshot
from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt
from baton.workers.training import rng
from baton.workers.training.control import LoopControl

from tests.helpers import assert_same_training, make_spec

pytestmark = pytest.mark.gpu


def test_cuda_rng_state_round_trips_and_holds_only_the_jobs_device():
    torch.cuda.manual_seed_all(5)
    state = rng.capture(torch.device("cuda"))
    first = torch.rand(4, device="cuda")
    rng.restore(state, torch.device("cuda"))
    assert torch.equal(torch.rand(4, device="cuda"), first)
    assert len(state["cuda"]) == 1  # a worker pinned to one GPU (--gpus) can resume it


def test_an_older_checkpoint_with_every_visible_devices_state_restores_the_jobs_own():
    torch.cuda.manual_seed_all(6)
    state = rng.capture(torch.device("cuda:0"))
    first = torch.rand(4, device="cuda:0")
    state["cuda"] = state["cuda"] + [torch.cuda.get_rng_state(0)] * 7  # as if saved on an 8-GPU node
    rng.restore(state, torch.device("cuda:0"))
    assert torch.equal(torch.rand(4, device="cuda:0"), first)


def test_pinned_snapshot_is_complete_when_take_returns_and_reuses_its_buffers():
    live = {"w": torch.randn(1024, 1024, device="cuda"), "step": torch.tensor(3.0, device="cuda")}
    snapshot = HostSnapshot(pin_memory=True)
    copy = snapshot.take(live)
    expected = live["w"].cpu()
    live["w"].add_(1.0)  # the loop moves on at once
    assert copy["w"].is_pinned() and copy["w"].device.type == "cpu"
    assert torch.equal(copy["w"], expected)
    buffer = copy["w"].data_ptr()
    assert snapshot.take(live)["w"].data_ptr() == buffer  # reused, not reallocated


class StopAt(LoopControl):
    def __init__(self, step: int):
        self.step, self.calls = step, 0

    def stop_reason(self):
        self.calls += 1
        return "interrupted" if self.calls == self.step else None

    def log(self, message: str) -> None:
        pass


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_resume_on_cuda_is_bit_exact(tmp_path, precision):
    spec = JobSpec.parse(make_spec(loop={"epochs": 2, "precision": precision},
                                   resources={"device": "cuda", "cpu_threads": 1}))
    store = FileStore(tmp_path)
    assert run_attempt(Attempt(spec, "reference", 1, store), AttemptOptions(StopAt(-1))).outcome.completed
    stopped = run_attempt(Attempt(spec, "cut", 1, store), AttemptOptions(StopAt(7)))
    assert not stopped.outcome.completed and stopped.outcome.step == 7
    resumed = run_attempt(Attempt(spec, "cut", 2, store), AttemptOptions(StopAt(-1)))
    assert resumed.outcome.completed and resumed.resumed_from_step == 7
    assert_same_training(store, "reference", store, "cut")


def test_a_run_paused_at_a_rung_on_cuda_and_continued_is_bit_exact(tmp_path):
    """A search's rung on a GPU: paused at the end of epoch 1 (fp16, its GradScaler, CUDA RNG), continued in a
    new attempt, equal to the same run never paused."""
    spec = JobSpec.parse(make_spec(loop={"epochs": 2, "precision": "fp16"},
                                   resources={"device": "cuda", "cpu_threads": 1}))
    store = FileStore(tmp_path)
    assert run_attempt(Attempt(spec, "reference", 1, store), AttemptOptions(StopAt(-1))).outcome.completed
    paused = run_attempt(Attempt(spec, "trial", 1, store, pause_at=1), AttemptOptions(StopAt(-1))).outcome
    assert (paused.completed, paused.reason) == (False, "paused")
    continued = run_attempt(Attempt(spec, "trial", 2, store), AttemptOptions(StopAt(-1)))
    assert continued.outcome.completed and continued.resumed_from_step == paused.step
    assert_same_training(store, "reference", store, "trial")
