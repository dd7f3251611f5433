"""Temporary directories named after the process that owns them, so that those of a dead process
can be found and removed.

A process killed outright (SIGKILL, the OOM killer, a node's hard reset of a container) removes
none of its temporary directories: a checkpoint spool keeps a whole serialized checkpoint, and
nothing else would ever delete it. Each directory's name therefore says who made it:

    <prefix><space>-<pid>-<start>-<random>

- ``pid`` and ``start``: the owner's pid and its start time (``/proc/<pid>/stat``, clock ticks
  since boot): a pid reused by a later process has another start time, so that process is not
  mistaken for the owner (and a dead owner's directories are not kept for ever);
- ``space``: which pids these are: a digest of the kernel's boot id and the pid namespace. A
  file:// store's scratch directory may be shared between machines or containers, where the same
  pid is another process; only directories made in this pid space are judged here.

Sweeping removes only directories of this user whose owner, in this pid space, is gone. Linux
only (``/proc``): elsewhere directories are named the same way (``space`` is ``x``) and never swept.

**Held directories** (``make(..., held=True)``: those on a machine's memory-backed ``/dev/shm``).
``/dev/shm`` outlives pid spaces: two containers with ``--ipc=host``, or a pod's memory-backed
``emptyDir`` that every restart of its container finds again in a new pid namespace (whose inode
number may even be one an earlier namespace had). There a pid says nothing about another space's
process, and a directory left by an earlier container would stay for the pod's life, counted
against its memory. So a held directory's owner holds an exclusive ``flock`` on its ``.owner``
file for as long as it lives: the kernel drops the lock when the owner dies, however it dies, and
any process of the machine, in any pid space, can test it. A held directory is an orphan exactly
when its lock is free; the sweeper removes it while holding that lock. (The lock file is locked
before it takes its name, so no sweeper can find it unlocked while its owner lives.)
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import stat
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Optional

PROC = Path("/proc")
UNKNOWN_SPACE = "x"
OWNER_LOCK = ".owner"
"""A held directory's lock file: locked (flock) by its owner for as long as it lives."""
SHM = Path("/dev/shm")
"""The machine's memory-backed file system, where held directories go."""
# Kinds of directory whose makers import torch, named here so that a worker's main process, which does
# not, can sweep those of a process killed outright (``workers/attempt/scratch.py``)
SPOOL_PREFIX = "baton-spool-"
"""Checkpoint spools: ``storage/checkpointing/checkpointer.py``, sharded checkpoints, best weights."""
RANKS_PREFIX = "baton-ranks-"
"""A multi-rank attempt's private directory (``workers/parallel/launcher.py``)."""
SNAPSHOT_PREFIX = "baton-snapshot-"
"""A checkpoint writer's shared buffers on ``/dev/shm`` (``storage/checkpointing/shared_buffers.py``)."""
HOME_PREFIX = "baton-home-"
"""A job's HOME for one attempt, where it runs as a user of its own (``baton.workers.attempt.job_users``)."""
GATE_PREFIX = "baton-gate-"
"""A worker's store gate for one attempt (``baton.workers.queue.store_gate``): its socket."""
_held: dict[Path, int] = {}  # this process's held directories -> the descriptor holding their lock


def writable(directory: Path) -> bool:
    """Whether files can go in ``directory`` (/dev/shm may be absent or read-only)."""
    return directory.is_dir() and os.access(directory, os.W_OK)


def _forget_held() -> None:
    """In a forked child (a DataLoader worker): the locks are its parent's. Closing the child's copies
    lets the parent's lock go with the parent (closing is not unlocking: the parent's stays held)."""
    for fd in _held.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


os.register_at_fork(after_in_child=_forget_held)


@lru_cache(maxsize=1)
def pid_space() -> str:
    """This process's pid space: the same for every process whose pids mean the same processes."""
    try:
        boot_id = (PROC / "sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink(PROC / "self/ns/pid")
    except OSError:
        return UNKNOWN_SPACE
    return hashlib.sha256(f"{boot_id}/{namespace}".encode()).hexdigest()[:12]


def start_time(pid: int) -> Optional[int]:
    """When ``pid`` started (clock ticks since boot), None if there is no such process (or no /proc)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the name before ")" may hold spaces
    except (OSError, ValueError, IndexError):
        return None


def owner_tag() -> str:
    pid = os.getpid()
    return f"{pid_space()}-{pid}-{start_time(pid) or 0}"


def make(prefix: str, directory: Optional[Path] = None, held: bool = False) -> Path:
    """A new directory ``<prefix><owner>-<random>`` in ``directory`` (the temporary directory if None);
    ``held``: its lock is held by this process until ``remove`` (module doc)."""
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}{owner_tag()}-", dir=directory))
    if held:
        fd = os.open(path / f"{OWNER_LOCK}.new", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(path / f"{OWNER_LOCK}.new", path / OWNER_LOCK)
        except OSError:
            os.close(fd)
            shutil.rmtree(path, ignore_errors=True)
            raise
        _held[path] = fd
    return path


def remove_tree(path: Path) -> None:
    """``shutil.rmtree``, through directories made read-only (a cache of shipped code): each is made
    writable by its owner when an entry in it cannot be removed. FileNotFoundError if ``path`` is gone.
    Only directories inside ``path`` are ever made writable: what holds it (``/tmp``) never is, and what
    another process removed meanwhile (a sweep of the same orphan) is passed over."""
    top = os.path.abspath(path)

    def writable_then_retry(func, name, error):
        if isinstance(error[1] if isinstance(error, tuple) else error, FileNotFoundError):
            return  # (removed meanwhile)
        try:
            if os.path.abspath(name) != top:
                os.chmod(os.path.dirname(name), 0o700)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, 0o700)
            func(name)
        except OSError:
            pass

    if not os.path.lexists(path):
        raise FileNotFoundError(path)
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=writable_then_retry)
    else:
        shutil.rmtree(path, onerror=writable_then_retry)


def _rmtree(path: Path) -> None:
    try:
        remove_tree(path)
    except FileNotFoundError:
        pass


def remove(path: Path) -> None:
    """Remove a directory this process made (its lock, if held, is let go once it is gone)."""
    _rmtree(path)
    fd = _held.pop(Path(path), None)
    if fd is not None:
        os.close(fd)


def _take_lock(path: Path) -> Optional[int]:
    """The descriptor holding ``path``'s owner lock, if its owner is gone (the lock was free); None
    if the lock is held, or there is no lock file (not a held directory)."""
    try:  # (never follow a link nor wait on a FIFO: a directory lent to a job's user could hold one)
        fd = os.open(path / OWNER_LOCK, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a lock file")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def orphaned(name: str, prefix: str) -> bool:
    """Whether the directory ``name`` (made by ``make`` with ``prefix``) belongs to a process of this
    pid space that is gone. Names in another format, or from another pid space, are never orphans."""
    parts = name[len(prefix):].split("-")
    if not name.startswith(prefix) or len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
        return False
    space, pid, start = parts[0], int(parts[1]), int(parts[2])
    if space == UNKNOWN_SPACE or space != pid_space():
        return False
    if start == 0:  # its owner could not read its own start time: the pid alone decides
        return start_time(pid) is None
    return start_time(pid) != start


def remove_orphans(directory: Optional[Path], prefixes: Iterable[str]) -> list[Path]:
    """Remove this user's directories in ``directory`` (the temporary directory if None) whose
    owner is gone; those removed."""
    base = Path(directory or tempfile.gettempdir())
    if not base.is_dir():
        return []
    removed = []
    for prefix in prefixes:
        for path in base.glob(f"{prefix}*"):
            try:
                mine = path.is_dir() and not path.is_symlink() and path.stat().st_uid == os.getuid()
                held = (path / OWNER_LOCK).exists()
            except OSError:  # removed meanwhile (by another process sweeping)
                continue
            if not mine or path in _held:
                continue
            if held:  # its lock decides, whatever pid space made it
                fd = _take_lock(path)
                if fd is not None:
                    _rmtree(path)
                    os.close(fd)
                    removed.append(path)
            elif orphaned(path.name, prefix):
                _rmtree(path)
                removed.append(path)
    return removed
