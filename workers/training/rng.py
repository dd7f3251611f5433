"""Capturing and restoring every random number generator a training step can draw from.

Stored in forms ``torch.load(weights_only=True)`` accepts: numpy's MT19937 state becomes an
int64 tensor of its keys plus plain numbers (np.random.get_state() as is would be refused).

CUDA generators belong to the job's device, not to the node: only the generator of the device the
job (or the rank) trains on is saved, and only for a job on ``cuda``, so a CPU job's checkpoint
resumes on any node, GPUs or not, and a CUDA job's on any node that gives it a device of its class
(a worker pinned to one GPU by ``--gpus`` included).
"""
from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import torch


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def capture(device: torch.device) -> dict[str, Any]:
    """Every generator a step of a job on ``device`` can draw from."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # (a tuple: MT19937's state)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"name": name, "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": [torch.cuda.get_rng_state(_cuda_index(device))] if device.type == "cuda" else [],
    }
    return state


def restore(state: dict[str, Any], device: torch.device) -> None:
    """Put back what ``capture`` saved; a job not on ``cuda`` ignores CUDA states. Older checkpoints
    saved one state per visible device (and whenever CUDA was visible): the job's device's is used."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state((np_state["name"], np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    cuda_states = state["cuda"] if device.type == "cuda" else []
    if cuda_states:
        index = _cuda_index(device)
        mine = cuda_states[0] if len(cuda_states) == 1 else (cuda_states[index] if index < len(cuda_states) else None)
        if mine is None:
            raise RuntimeError(f"checkpoint holds RNG states for {len(cuda_states)} CUDA devices, none for "
                               f"this job's device cuda:{index}")
        torch.cuda.set_rng_state(mine, index)


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
