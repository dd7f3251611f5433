"""Which checkpoint a resume starts from (issue 9): corruption falls back to the one before it; a
checkpoint whose bytes verify but that this process cannot load is an environment problem, and
falling back (then deleting it) would silently throw committed training away."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from baton.schemas.errors import PermanentError
from baton.storage.checkpointing.contract import CheckpointTarget
from baton.storage.checkpointing.checkpointer import AsyncCheckpointer
from baton.storage.checkpointing.contract import CheckpointRequest
from baton.storage.layout import JobPaths
from baton.storage.manifest_store import ManifestStore
from baton.workers.attempt.resume import load_latest_good

PATHS = JobPaths("env")


def test_a_verified_checkpoint_that_cannot_be_loaded_fails_the_attempt_and_is_kept(store):
    ckpt = AsyncCheckpointer(CheckpointTarget(store, PATHS, 1, keep_last=3, log=lambda m: None))
    ckpt.save(lambda: {"format": 1, "w": torch.ones(4)}, CheckpointRequest(1, 0, 1, "step"), mandatory=True)
    # as written by an environment this one cannot read: torch.load(weights_only=True) refuses it
    ckpt.save(lambda: {"format": 1, "w": torch.ones(4), "extra": np.arange(3)}, CheckpointRequest(2, 0, 2, "step"),
              mandatory=True)
    ckpt.close()
    manifests = ManifestStore(store, PATHS)
    before = manifests.read()
    logged: list[str] = []
    with pytest.raises(PermanentError) as failure:
        load_latest_good(store, before, logged.append)
    message = str(failure.value)
    assert before.latest.key in message and "sha256 verified" in message and "weights_only" in message.lower()
    assert not any("falling back" in m for m in logged)
    assert manifests.read() == before and store.exists(before.latest.key)
