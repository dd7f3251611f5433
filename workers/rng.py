"""Capturing and restoring every random number generator a training step can draw from.

Stored in forms ``torch.load(weights_only=True)`` accepts: numpy's MT19937 state becomes an
int64 tensor of its keys plus plain numbers (np.random.get_state() as is would be refused).

CUDA generators belong to the job's device, not to the node: they are saved only for a job on
``cuda`` and restored only into one, so a CPU job's checkpoint resumes on any node, GPUs or not.
"""
from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import torch


def capture(device_type: str) -> dict[str, Any]:
    """Every generator a step of a job on ``device_type`` ("cpu", "cuda") can draw from."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if device_type == "cuda" else [],
    }
    return state


def restore(state: dict[str, Any], device_type: str) -> None:
    """Put back what ``capture`` saved; a job not on ``cuda`` ignores CUDA states (older
    checkpoints saved them whenever CUDA was visible)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state((np_state["name"], np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    cuda_states = state["cuda"] if device_type == "cuda" else []
    if cuda_states:
        if not torch.cuda.is_available() or torch.cuda.device_count() < len(cuda_states):
            raise RuntimeError(
                f"checkpoint holds RNG state for {len(cuda_states)} CUDA device(s); this worker has "
                f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}: resume on the same device class"
            )
        torch.cuda.set_rng_state_all(cuda_states)


def seed_all(seed: int) -> None:
    """Seed python, numpy and torch (CPU and every CUDA device) from one number."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@contextmanager
def kept_through_imports() -> Iterator[None]:
    """Python's, numpy's and torch's CPU generators as they were before the block. Wraps imports of
    user and optional modules: an import's side effects (importing ``sklearn.datasets`` reseeds
    Python's ``random``) must not make a job's random stream depend on whether the module was
    already imported in this process (a worker that ran another job first, a test process)."""
    python, numpy_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
