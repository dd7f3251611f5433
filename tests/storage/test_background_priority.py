"""The checkpointer's background thread yields to training: it runs niced, the caller does not."""
from __future__ import annotations

import os
import sys
import threading

import pytest
import torch

from storage.checkpointer import AsyncCheckpointer, CheckpointRequest
from storage.file_store import FileStore
from storage.layout import JobPaths
from storage.priority import BACKGROUND_NICE_INCREMENT, lower_this_thread

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@linux
def test_checkpoint_thread_runs_below_the_training_thread(tmp_path):
    before = _nice()
    seen = []
    ckpt = AsyncCheckpointer(FileStore(tmp_path), JobPaths("j"), attempt=1, keep_last=2, log=lambda m: None,
                             on_commit=lambda manifest, stats: seen.append(_nice()))
    ckpt.save(lambda: {"format": 1, "w": torch.ones(3)}, CheckpointRequest(1, 0, 1, "step"), mandatory=True)
    ckpt.close()
    assert seen == [min(19, before + BACKGROUND_NICE_INCREMENT)]
    assert _nice() == before  # only the background thread was lowered


@linux
def test_lowering_changes_only_the_calling_thread():
    before = _nice()
    result = []
    thread = threading.Thread(target=lambda: result.append((lower_this_thread(3), _nice())))
    thread.start()
    thread.join()
    assert result == [(min(19, before + 3), min(19, before + 3))] and _nice() == before
    assert lower_this_thread(0) is None and _nice() == before
