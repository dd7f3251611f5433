"""The checkpoint writer process: what the training process can rely on about it.

Its commit protocol (fence, cancel, a stale attempt refused) is tested with both writers in
test_attempt_isolation.py and test_commit.py; here: which writer a checkpointer gets, the shared
snapshot buffers, and the process's life (signals, death, its parent's death)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from baton.schemas.errors import CheckpointWriteFailed
from baton.storage.checkpoint_io import load_bytes
from baton.storage.checkpointing.contract import CheckpointTarget
from baton.storage.checkpointing.checkpointer import WRITER_ENV, AsyncCheckpointer, writer_kind
from baton.storage.checkpointing.contract import CheckpointRequest
from baton.storage.stores.file_store import FileStore
from baton.storage.layout import JobPaths
from baton.storage.manifest_store import ManifestStore

PATHS = JobPaths("w")


def _checkpointer(store, **options) -> AsyncCheckpointer:
    """A checkpointer whose writer process has started (before that, its thread writes)."""
    ckpt = AsyncCheckpointer(CheckpointTarget(store, PATHS, attempt=1, keep_last=5, log=lambda m: None), **options)
    assert ckpt.writer == "process" and ckpt.wait_for_writer(60)
    return ckpt


def _save(ckpt: AsyncCheckpointer, step: int, state: dict) -> None:
    ckpt.save(lambda: {"format": 1, **state}, CheckpointRequest(step, 0, step, "step"), mandatory=True)


def _committed(store, step: int) -> dict:
    entry = next(e for e in ManifestStore(store, PATHS).read().checkpoints if e.step == step)
    return load_bytes(store.get_bytes(entry.key), entry.sha256)


class WrappedStore(FileStore):
    """A store another process cannot rebuild from its URL (it could behave differently)."""


def test_which_writer_a_checkpointer_gets(tmp_path, monkeypatch):
    monkeypatch.delenv(WRITER_ENV, raising=False)
    store = FileStore(tmp_path)
    assert writer_kind(store, pin_memory=False) == "process"
    assert writer_kind(store, pin_memory=True) == "thread"  # CUDA's pinned buffers are not shared files
    assert writer_kind(WrappedStore(tmp_path), pin_memory=False) == "thread"
    assert writer_kind(store, pin_memory=False, setting="thread") == "thread"
    monkeypatch.setenv(WRITER_ENV, "thread")
    assert writer_kind(store, pin_memory=False) == "thread"
    monkeypatch.setenv(WRITER_ENV, "processes")
    with pytest.raises(ValueError, match=WRITER_ENV):
        writer_kind(store, pin_memory=False)


def test_checkpoints_from_shared_buffers_hold_exactly_the_state_even_as_shapes_change(tmp_path):
    store = FileStore(tmp_path / "store")
    ckpt = _checkpointer(store)
    assert ckpt.writer == "process"
    states = {
        1: {"w": torch.randn(3, 4), "step": torch.tensor(7.0), "empty": torch.empty(0), "note": "a"},
        2: {"w": torch.randn(5, 2, dtype=torch.float64), "step": torch.tensor(8.0), "empty": torch.empty(0),
            "extra": [torch.arange(6, dtype=torch.int16).view(2, 3)], "note": "b"},
        3: {"w": torch.randn(5, 2, dtype=torch.float64), "step": torch.tensor(9.0), "empty": torch.empty(0),
            "bf16": torch.randn(4).to(torch.bfloat16), "note": "c"},
    }
    for step, state in states.items():
        _save(ckpt, step, state)
        ckpt.wait()
    buffers = ckpt._shared.dir
    # w's first buffer was deleted when its shape changed; step, extra's and bf16's remain with w's second
    assert sorted(p.name for p in buffers.iterdir() if p.name != ".owner") == ["t1", "t2", "t3", "t4"]
    ckpt.close()
    assert not buffers.exists()
    for step, state in states.items():
        loaded = _committed(store, step)
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), (step, key)
            elif isinstance(value, list):
                assert all(torch.equal(a, b) for a, b in zip(loaded[key], value))
            else:
                assert loaded[key] == value


def test_a_killed_writer_fails_its_checkpoints_as_the_machines_fault_naming_it(tmp_path):
    """A local process's death (the OOM killer) is a loss, counted: not "storage unavailable", which
    is released uncounted and would retry for ever."""
    ckpt = _checkpointer(FileStore(tmp_path))
    _save(ckpt, 1, {"w": torch.ones(3)})
    ckpt.wait()
    os.kill(ckpt._process.proc.pid, signal.SIGKILL)
    ckpt._process.proc.wait(10)
    for step in (2, 3):  # the one after it as well: nothing is committed without a writer
        _save(ckpt, step, {"w": torch.ones(3)})
        with pytest.raises(CheckpointWriteFailed, match="checkpoint writer process .* exited with code -9"):
            ckpt.wait()
    ckpt.abandon()


def test_the_writer_ignores_the_signals_meant_for_the_training_process(tmp_path):
    """A Ctrl-C reaches the whole process group; SIGTERM may too. The training process decides
    when to stop, and its stop checkpoint still needs the writer."""
    store = FileStore(tmp_path)
    ckpt = _checkpointer(store)
    _save(ckpt, 1, {"w": torch.ones(3)})
    ckpt.wait()
    for sig in (signal.SIGINT, signal.SIGTERM):
        os.kill(ckpt._process.proc.pid, sig)
    time.sleep(0.2)
    _save(ckpt, 2, {"w": torch.full((3,), 2.0)})
    ckpt.close()
    assert torch.equal(_committed(store, 2)["w"], torch.full((3,), 2.0))


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for whoever reaps it here)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_the_writer_dies_with_its_training_process(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time, torch
        from baton.storage.checkpointing.checkpointer import AsyncCheckpointer
        from baton.storage.checkpointing.contract import CheckpointRequest, CheckpointTarget
        from baton.storage.stores.file_store import FileStore
        from baton.storage.layout import JobPaths
        ckpt = AsyncCheckpointer(CheckpointTarget(FileStore({str(tmp_path)!r}), JobPaths("w"), 1, 2, log=print))
        ckpt.save(lambda: {{"format": 1, "w": torch.ones(3)}}, CheckpointRequest(1, 0, 1, "step"), mandatory=True)
        ckpt.wait()
        print(ckpt._process.proc.pid, flush=True)
        time.sleep(600)
    """)
    root = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=root)
    try:
        writer_pid = int(parent.stdout.readline())
        os.kill(writer_pid, 0)  # alive
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not _running(writer_pid):
                return
            time.sleep(0.05)
        pytest.fail(f"the writer process {writer_pid} outlived its training process")
    finally:
        parent.kill()


def test_snapshot_buffers_move_to_the_spool_when_tmpfs_is_full(tmp_path):
    """A container's /dev/shm is 64 MB by default: a full tmpfs is found out when a buffer is
    reserved, never by a SIGBUS at the training process's first write into it."""
    from baton.storage.checkpointing.shared_buffers import SharedBuffers

    tiny, spool = tmp_path / "tiny", tmp_path / "spool"
    tiny.mkdir()
    spool.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tiny)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        logged: list[str] = []
        shared = SharedBuffers(spool, logged.append, tmpfs=tiny, headroom=16 << 10)
        small = shared.allocate(torch.Size([100]), torch.float32)
        big = shared.allocate(torch.Size([12 << 10]), torch.float32)  # 48 KiB: fits, but not with 16 KiB left to others
        big.fill_(3.0)
        assert Path(shared.to_slots(small).path).parent.parent == tiny
        assert Path(shared.to_slots(big).path).parent.parent == spool
        assert len(logged) == 1 and "has no room" in logged[0]
        shared.close()
        assert list(tiny.iterdir()) == [] and list(spool.iterdir()) == []
        del small, big, shared  # their mappings keep the tmpfs busy
    finally:
        subprocess.run(["umount", "--lazy", str(tiny)], check=False)


def test_buffers_left_on_tmpfs_by_a_killed_training_process_are_removed_by_the_next(tmp_path):
    """A SIGKILLed training process cannot remove its buffers, which are RAM on a tmpfs."""
    from baton.storage.checkpointing.shared_buffers import PREFIX, SharedBuffers

    tmpfs, spool = tmp_path / "shm", tmp_path / "spool"
    tmpfs.mkdir()
    spool.mkdir()
    make = ("import sys; from pathlib import Path; from baton.storage.checkpointing.shared_buffers import SharedBuffers; "
            "b = SharedBuffers(Path(sys.argv[2]), print, tmpfs=Path(sys.argv[1]), headroom=0); "
            "print(b.dir, flush=True); sys.stdin.read()")
    owners = [subprocess.Popen([sys.executable, "-c", make, str(tmpfs), str(spool)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        orphan, alive = (Path(owner.stdout.readline().strip()) for owner in owners)
        owners[0].kill()  # SIGKILL: it removes nothing
        owners[0].wait()
        assert orphan.is_dir()
        shared = SharedBuffers(spool, print, tmpfs=tmpfs, headroom=0)
        assert not orphan.exists() and alive.exists()  # a live process's: kept
        assert shared.dir.parent == tmpfs and shared.dir.name.startswith(PREFIX)
        shared.close()
        assert not shared.dir.exists()
    finally:
        for owner in owners:
            owner.kill()
            owner.wait()


def test_a_writer_failure_comes_back_as_its_own_type_without_unpickling():
    from baton.schemas.errors import ManifestAhead, StorageUnavailable
    from baton.storage.checkpointing.writer_process import _described, _exception

    again = _exception(*_described(ManifestAhead("attempt 1 is stale", 2)))
    assert type(again) is ManifestAhead and again.current == 2 and str(again) == "attempt 1 is stale"
    assert type(_exception(*_described(StorageUnavailable("s3 down")))) is StorageUnavailable
    # anything else is the machine's (no code of the job's runs in the writer): a loss, never the job's failure
    for other in (RuntimeError("mapping a buffer failed"), MemoryError("serializing"), PermissionError("denied")):
        again = _exception(*_described(other))
        assert type(again) is CheckpointWriteFailed and f"{type(other).__name__}: {other}" in str(again)
    assert type(_exception("SomethingElse", "boom", ())) is CheckpointWriteFailed


def test_a_writer_still_starting_is_not_waited_for_at_close(tmp_path):
    """It holds no checkpoint yet (those due meanwhile go to the thread): an attempt preempted seconds
    after its start hands its job over without waiting out the writer's imports."""
    store = FileStore(tmp_path / "store")
    ckpt = AsyncCheckpointer(CheckpointTarget(store, PATHS, attempt=1, keep_last=5, log=lambda m: None))
    assert ckpt.writer == "process" and not ckpt._process.ready.is_set()
    _save(ckpt, 1, {"w": torch.ones(3)})  # by the thread writer: the process is still importing torch
    ckpt.close()
    assert ckpt._process.proc.returncode == -signal.SIGKILL
    assert torch.equal(_committed(store, 1)["w"], torch.ones(3))


def test_a_buffer_file_removed_before_the_writer_maps_it_is_the_machines_fault_not_zeros(tmp_path):
    """Mapping by name would create the missing file, full of zeros, and commit that."""
    from baton.storage.checkpointing.shared_buffers import MappedBuffers, Slot

    path = tmp_path / "t0"
    slot = Slot(str(path), (4,), torch.float32)
    with pytest.raises(CheckpointWriteFailed, match="is gone"):
        MappedBuffers().from_slots({"w": slot})
    assert not path.exists()
    path.write_bytes(b"x" * 8)  # shorter than the tensor
    with pytest.raises(CheckpointWriteFailed, match="holds 8 bytes, not 16"):
        MappedBuffers().from_slots({"w": slot})
