"""/dev/shm outlives pid namespaces (containers sharing it with --ipc=host, a pod's memory-backed
emptyDir that each restart of its container finds again): what one worker leaves there must be swept
by the next, in whatever pid namespace, and a live process's buffers never are.

Real processes in real pid namespaces (``unshare --pid``, as root); a directory standing for
/dev/shm, so that no other process's buffers are touched."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from baton.schemas.errors import CheckpointWriteFailed
from baton.storage.checkpointing.shared_buffers import SharedBuffers

from tests.helpers import REPO, baton_env

UNSHARE = shutil.which("unshare")


def _namespaces_available() -> bool:
    if UNSHARE is None or os.geteuid() != 0:
        return False
    return subprocess.run([UNSHARE, "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not _namespaces_available(), reason="needs unshare --pid (root)")

SNAPSHOT_OWNER = """
import sys
from pathlib import Path
import torch
from baton.storage.checkpointing.shared_buffers import SharedBuffers
Path(sys.argv[2]).mkdir()
buffers = SharedBuffers(Path(sys.argv[2]), print, tmpfs=Path(sys.argv[1]), headroom=0)
buffers.allocate(torch.Size([1024]), torch.float32)
print(buffers.dir, flush=True)
sys.stdin.read()
"""
SNAPSHOT_SWEEP = """
import sys
from pathlib import Path
from baton.storage.checkpointing.shared_buffers import remove_orphans
print(len(remove_orphans(Path(sys.argv[1]))), flush=True)
"""
MEMORY_OWNER = """
import sys
from pathlib import Path
from baton.storage.memory import memory_dirs
memory_dirs.SHM = Path(sys.argv[1])
print(memory_dirs.make_dirs()[0], flush=True)
sys.stdin.read()
"""
MEMORY_SWEEP = """
import sys
from pathlib import Path
from baton.storage.memory import memory_dirs
memory_dirs.SHM = Path(sys.argv[1])
print(len(memory_dirs.remove_orphans()), flush=True)
"""


def python(code: str, *args: str, namespace: bool, tmp: Path, **popen) -> subprocess.Popen:
    """``code`` in a new process; in a pid namespace of its own (as in another container) if asked."""
    command = [sys.executable, "-c", code, *args]
    if namespace:
        command = [UNSHARE, "--pid", "--fork", "--mount-proc", "--kill-child", *command]
    return subprocess.Popen(command, cwd=REPO, env=baton_env(TMPDIR=str(tmp)), text=True, stdout=subprocess.PIPE,
                            **popen)


def sweep(code: str, shm: Path, tmp: Path) -> int:
    """What a worker starting in another pid namespace removes."""
    out, _ = python(code, str(shm), namespace=True, tmp=tmp).communicate(timeout=120)
    return int(out.strip().splitlines()[-1])


@pytest.fixture
def places(tmp_path):
    shm, tmp = tmp_path / "shm", tmp_path / "tmp"
    shm.mkdir()
    tmp.mkdir()
    return shm, tmp


@pytest.mark.parametrize("owner_code, sweep_code", [(SNAPSHOT_OWNER, SNAPSHOT_SWEEP), (MEMORY_OWNER, MEMORY_SWEEP)],
                         ids=["snapshot-buffers", "in-memory-copies"])
def test_a_sweep_from_another_pid_namespace_keeps_a_live_owners_directory_and_takes_a_dead_ones(
        places, owner_code, sweep_code):
    shm, tmp = places
    owner = python(owner_code, str(shm), str(tmp / "spool"), namespace=False, tmp=tmp, stdin=subprocess.PIPE)
    try:
        made = Path(owner.stdout.readline().strip())
        assert made.parent == shm and made.is_dir(), made
        sweep(sweep_code, shm, tmp)
        assert made.is_dir(), "a live process's directory was swept"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    # its owner was SIGKILLed: the next worker (a restarted container: another pid namespace) takes it
    assert sweep(sweep_code, shm, tmp) >= 1 and not made.exists(), "a dead process's directory stayed"


@pytest.mark.slow
def test_a_pid_reused_in_another_namespace_does_not_keep_a_dead_owners_directory(places):
    """Every container's first processes have the same small pids: the directory of a SIGKILLed
    owner in an earlier container is swept even while a process with its pid lives in the next."""
    shm, tmp = places
    owner = python(MEMORY_OWNER, str(shm), namespace=True, tmp=tmp, stdin=subprocess.PIPE)
    made = Path(owner.stdout.readline().strip())
    owner.send_signal(signal.SIGKILL)  # unshare's child (the owner, a low pid in its namespace) dies with it
    owner.wait()
    again = python(MEMORY_OWNER, str(shm), namespace=True, tmp=tmp, stdin=subprocess.PIPE)  # the same low pid
    try:
        kept = Path(again.stdout.readline().strip())
        sweep(MEMORY_SWEEP, shm, tmp)  # (its disk-side directory may go too: a namespace's number can come again)
        assert not made.exists() and kept.is_dir()
    finally:
        again.send_signal(signal.SIGKILL)
        again.wait()


def test_a_vanished_buffer_directory_is_the_machines_fault(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    (tmp_path / "spool").mkdir()
    buffers = SharedBuffers(tmp_path / "spool", lambda line: None, tmpfs=shm, headroom=0)
    buffers.allocate(torch.Size([8]), torch.float32)
    shutil.rmtree(buffers.dir)  # as a stranger's sweep would
    with pytest.raises(CheckpointWriteFailed, match="is gone"):
        buffers.allocate(torch.Size([8]), torch.float32)
