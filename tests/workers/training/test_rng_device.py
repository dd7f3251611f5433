"""CUDA RNG state belongs to CUDA jobs only (issue 9): a CPU job's checkpoint that carries CUDA
generator states (written on a node that saw GPUs) must resume on a node without any, bit-exact."""
from __future__ import annotations

import torch

from baton.schemas.spec import JobSpec
from baton.storage.checkpoint_io import load_bytes, save_to_file
from baton.storage.stores.file_store import FileStore
from baton.storage.layout import JobPaths
from baton.storage.manifest_store import ManifestStore
from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt
from baton.workers.training.control import LoopControl

from tests.helpers import assert_same_training, make_spec

SPEC = JobSpec.parse(make_spec(loop={"epochs": 2}))


class StopAt(LoopControl):
    def __init__(self, step: int):
        self.step, self.calls = step, 0

    def stop_reason(self):
        self.calls += 1
        return "interrupted" if self.calls == self.step else None

    def log(self, message: str) -> None:
        pass


def _as_if_written_on_a_gpu_node(store: FileStore, job_id: str, tmp_path) -> None:
    """Give the latest checkpoint the CUDA generator state a 1-GPU node would have added."""
    manifests = ManifestStore(store, JobPaths(job_id))
    entry = manifests.read().latest
    state = load_bytes(store.get_bytes(entry.key), entry.sha256)
    assert state["config"]["device_type"] == "cpu"
    state["rng"]["cuda"] = [torch.zeros(16, dtype=torch.uint8)]
    size, sha256 = save_to_file(state, tmp_path / "ckpt.pt")
    store.put_file(entry.key, tmp_path / "ckpt.pt")

    def rewrite(manifest) -> None:
        manifest.checkpoints[-1] = manifest.checkpoints[-1].model_copy(update={"size": size, "sha256": sha256})
    manifests.update(manifests.read().attempt, rewrite)


def test_a_cpu_job_ignores_cuda_rng_states_on_resume(tmp_path):
    store = FileStore(tmp_path / "store")
    assert run_attempt(Attempt(SPEC, "reference", 1, store), AttemptOptions(StopAt(-1))).outcome.completed
    assert not run_attempt(Attempt(SPEC, "moved", 1, store), AttemptOptions(StopAt(7))).outcome.completed
    _as_if_written_on_a_gpu_node(store, "moved", tmp_path)
    resumed = run_attempt(Attempt(SPEC, "moved", 2, store), AttemptOptions(StopAt(-1)))
    assert resumed.outcome.completed and resumed.resumed_from_step == 7
    assert_same_training(store, "reference", store, "moved")
