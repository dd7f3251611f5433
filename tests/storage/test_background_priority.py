"""The checkpointer's writer yields to training when asked: its thread or its process runs niced,
the training thread does not."""
from __future__ import annotations

import os
import sys
import threading

import pytest
import torch

from baton.storage.checkpointing.contract import CheckpointTarget
from baton.storage.checkpointing.checkpointer import AsyncCheckpointer
from baton.storage.checkpointing.contract import CheckpointRequest
from baton.storage.stores.file_store import FileStore
from baton.storage.layout import JobPaths
from baton.storage.checkpointing.priority import NICE_ENV, background_nice, lower_this_thread

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _commit_nice(tmp_path, **options) -> list[int]:
    """The nice value of the thread writer's thread, seen from its on_commit."""
    seen = []
    ckpt = AsyncCheckpointer(CheckpointTarget(FileStore(tmp_path), JobPaths("j"), attempt=1, keep_last=2, log=lambda m: None, on_commit=lambda manifest, stats: seen.append(_nice())), writer="thread", **options)
    ckpt.save(lambda: {"format": 1, "w": torch.ones(3)}, CheckpointRequest(1, 0, 1, "step"), mandatory=True)
    ckpt.close()
    return seen


@linux
def test_checkpoint_thread_runs_below_the_training_thread_when_asked(tmp_path, monkeypatch):
    before = _nice()
    monkeypatch.setenv(NICE_ENV, "10")
    assert _commit_nice(tmp_path / "a") == [min(19, before + 10)]
    assert _commit_nice(tmp_path / "b", background_nice=4) == [min(19, before + 4)]
    assert _nice() == before  # only the background thread was lowered


def _writer_process_nice(tmp_path, **options) -> int:
    ckpt = AsyncCheckpointer(CheckpointTarget(FileStore(tmp_path), JobPaths("j"), attempt=1, keep_last=2, log=lambda m: None), writer="process", **options)
    try:
        assert ckpt.wait_for_writer(60)
        ckpt.save(lambda: {"format": 1, "w": torch.ones(3)}, CheckpointRequest(1, 0, 1, "step"), mandatory=True)
        ckpt.wait()  # the writer has set its priority before it committed
        return os.getpriority(os.PRIO_PROCESS, ckpt._process.proc.pid)
    finally:
        ckpt.close()


@linux
def test_the_writer_process_runs_below_the_training_thread_when_asked(tmp_path, monkeypatch):
    before = _nice()
    monkeypatch.setenv(NICE_ENV, "10")
    assert _writer_process_nice(tmp_path / "a") == min(19, before + 10)
    assert _writer_process_nice(tmp_path / "b", background_nice=0) == before
    assert _nice() == before


@linux
def test_by_default_the_checkpoint_thread_keeps_the_training_priority(tmp_path, monkeypatch):
    monkeypatch.delenv(NICE_ENV, raising=False)
    assert _commit_nice(tmp_path) == [_nice()]


def test_a_bad_nice_setting_is_refused_naming_the_variable(monkeypatch):
    for bad in ("x", "-1", "20"):
        monkeypatch.setenv(NICE_ENV, bad)
        with pytest.raises(ValueError, match=NICE_ENV):
            background_nice()


@linux
def test_lowering_changes_only_the_calling_thread():
    before = _nice()
    result = []
    thread = threading.Thread(target=lambda: result.append((lower_this_thread(3), _nice())))
    thread.start()
    thread.join()
    assert result == [(min(19, before + 3), min(19, before + 3))] and _nice() == before
    assert lower_this_thread(0) is None and _nice() == before


def test_a_bad_nice_setting_fails_the_checkpointer_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv(NICE_ENV, "high")
    with pytest.raises(ValueError, match=NICE_ENV):
        AsyncCheckpointer(CheckpointTarget(FileStore(tmp_path), JobPaths("j"), attempt=1, keep_last=2, log=lambda m: None))
