"""Snapshot buffers that another process can read: one file per tensor, mapped by both.

The training process copies its state into these buffers (``HostSnapshot`` with ``allocate``);
the writer process maps the same files by name and serializes straight from them, so no tensor
byte crosses a pipe and nothing is copied a second time. Each file is a whole tensor's storage,
so ``torch.save`` in the writer writes that tensor alone (a view into one shared arena would
write the whole arena for each tensor).

The files live on tmpfs (``/dev/shm``) while it keeps ``SHM_HEADROOM`` free besides them (DataLoader
worker processes pass their batches through it too), else in the checkpoint spool (on disk, through
the page cache: the kernel writes the copies back in the background). Space is reserved with
``posix_fallocate`` before a file is mapped, so a full tmpfs (a container's default 64 MB /dev/shm)
is found out at allocation, and the buffers move to the spool, instead of killing the training
process with SIGBUS at its first write. Each directory on the tmpfs is a held ``owned_dirs``
directory of its training process: one left behind by a process killed with SIGKILL (its buffers
are RAM on a tmpfs) is removed by the next checkpointer started on the machine, in whatever pid
namespace (another container sharing the tmpfs, or the next container of a pod), and a live one
never is. A buffer whose directory vanished all the same (removed by hand) fails the checkpoint as
the machine's fault (``CheckpointWriteFailed``: a loss), never as the job's.
"""
from __future__ import annotations

import errno
import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from baton.schemas.errors import CheckpointWriteFailed

from baton.storage import owned_dirs
from baton.storage.checkpointing.plain import Plain, only_scalars

SHM = owned_dirs.SHM
PREFIX = owned_dirs.SNAPSHOT_PREFIX
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)
"""Errors that say the machine has no room for a buffer (anything else, such as too many open files,
is not the machine's fault and is raised as it is)."""
SHM_HEADROOM = 256 << 20
"""Bytes of the tmpfs left to others (DataLoader workers): buffers that would eat into them go to the spool."""


@dataclass(frozen=True)
class Slot:
    """A tensor in a shared buffer file: what the writer process receives instead of its bytes."""

    path: str
    shape: tuple[int, ...]
    dtype: torch.dtype


class SharedBuffers:
    """The training process's side: allocates buffers as files, and turns a snapshot into slots."""

    def __init__(self, spool: Path, log: Callable[[str], None] = print, tmpfs: Path = SHM,
                 headroom: int = SHM_HEADROOM):
        bases = ([tmpfs] if owned_dirs.writable(tmpfs) else []) + [spool]
        if bases[0] == tmpfs:
            remove_orphans(tmpfs)
        dirs = [owned_dirs.make(PREFIX, base, held=base == tmpfs) for base in bases]
        self._start(dirs, list(dirs), log, headroom)

    @classmethod
    def within(cls, dirs: list[Path], log: Callable[[str], None] = print,
               headroom: int = SHM_HEADROOM) -> "SharedBuffers":
        """Buffers in directories someone else made and removes (an in-memory copy's slot: it must
        outlive this process), the first preferred, the next used once one has no room."""
        buffers = cls.__new__(cls)
        buffers._start(list(dirs), [], log, headroom)
        return buffers

    def _start(self, dirs: list[Path], made: list[Path], log: Callable[[str], None], headroom: int) -> None:
        self.dirs, self.log, self.headroom = dirs, log, headroom
        self._made = made  # removed at close (a full one leaves ``dirs`` but keeps its earlier buffers)
        self._paths: dict[int, Path] = {}  # a buffer's storage address -> its file
        self._counter = itertools.count()

    @property
    def dir(self) -> Path:
        """Where new buffers go."""
        return self.dirs[0]

    def allocate(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        numel = shape.numel()
        if numel == 0:  # nothing to map: travels in the message
            return torch.empty(shape, dtype=dtype)
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        while True:
            path = self.dir / f"t{next(self._counter)}"
            try:
                if len(self.dirs) > 1 and _free(self.dir) < nbytes + self.headroom:
                    raise OSError(errno.ENOSPC, "less free than the buffer and the headroom left to others")
                fd = _reserve(path, nbytes)
                break
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    raise CheckpointWriteFailed(f"the snapshot buffers' directory {self.dir} is gone (another process "
                                                "removed it): this machine's fault, not the job's") from exc
                if exc.errno not in NO_ROOM:
                    raise
                if exc.errno != errno.ENOSPC or len(self.dirs) == 1:
                    raise CheckpointWriteFailed(f"no room for a {nbytes}-byte snapshot buffer in {self.dir}: "
                                                f"{exc.strerror}") from exc
                full = self.dirs.pop(0)
                self.log(f"{full.parent} has no room for more snapshot buffers; they go to "
                         f"{self.dir.parent} instead (page cache; give the container a larger /dev/shm)")
        try:  # through the descriptor: the file reserved, even if its name went meanwhile
            buffer = torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=numel, dtype=dtype).view(shape)
        finally:
            os.close(fd)
        self._paths[buffer.untyped_storage().data_ptr()] = path
        return buffer

    def release(self, buffer: torch.Tensor) -> None:
        """A buffer replaced by another (its tensor changed shape): its file goes."""
        path = self._paths.pop(buffer.untyped_storage().data_ptr(), None)
        if path is not None:
            path.unlink(missing_ok=True)

    def to_slots(self, obj: Any) -> Any:
        """``obj`` with every tensor held in a buffer file replaced by its Slot."""
        if isinstance(obj, torch.Tensor):
            path = self._paths.get(obj.untyped_storage().data_ptr())
            return obj if path is None else Slot(str(path), tuple(obj.shape), obj.dtype)
        if isinstance(obj, Plain):
            return obj  # no tensors inside (snapshot.py)
        if isinstance(obj, dict):
            return {k: self.to_slots(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)) and only_scalars(obj):
            return obj
        if isinstance(obj, list):
            return [self.to_slots(v) for v in obj]
        if isinstance(obj, tuple):
            return tuple(self.to_slots(v) for v in obj)
        return obj

    def close(self) -> None:
        for directory in self._made:
            owned_dirs.remove(directory)


def remove_orphans(tmpfs: Path) -> list[Path]:
    """Remove the buffer directories on ``tmpfs`` whose training process is gone (SIGKILLed: it
    could not remove them), in any pid namespace; those removed."""
    return owned_dirs.remove_orphans(tmpfs, (PREFIX,))



def _free(directory: Path) -> int:
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


def _reserve(path: Path, nbytes: int) -> int:
    """A new file of ``nbytes`` reserved on its file system; its descriptor (the caller closes it)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    return fd


def _map_existing(path: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The buffer file at ``path``, mapped; CheckpointWriteFailed if it is gone or short (never a new
    file of zeros in its place, as mapping by name would make)."""
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        raise CheckpointWriteFailed(f"the snapshot buffer {path} is gone (another process removed it): this "
                                    "machine's fault, not the job's") from None
    try:
        if os.fstat(fd).st_size < nbytes:
            raise CheckpointWriteFailed(f"the snapshot buffer {path} holds {os.fstat(fd).st_size} bytes, not {nbytes}")
        return torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=numel, dtype=dtype)
    finally:
        os.close(fd)


class MappedBuffers:
    """The writer process's side: maps the files a message names, and turns slots back into tensors."""

    def __init__(self):
        self._mapped: dict[str, torch.Tensor] = {}

    def from_slots(self, obj: Any, used: Optional[set[str]] = None) -> Any:
        used = set() if used is None else used
        result = self._resolve(obj, used)
        for name in set(self._mapped) - used:  # buffers the training process replaced: unmap them
            del self._mapped[name]
        return result

    def _resolve(self, obj: Any, used: set[str]) -> Any:
        if isinstance(obj, Slot):
            used.add(obj.path)
            tensor = self._mapped.get(obj.path)
            numel = torch.Size(obj.shape).numel()
            if tensor is None or tensor.dtype != obj.dtype or tensor.numel() != numel:
                tensor = _map_existing(obj.path, numel, obj.dtype)
                self._mapped[obj.path] = tensor
            return tensor.view(obj.shape)
        if isinstance(obj, Plain):
            return obj
        if isinstance(obj, dict):
            return {k: self._resolve(v, used) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self._resolve(v, used) for v in obj]
        if isinstance(obj, tuple):
            return tuple(self._resolve(v, used) for v in obj)
        return obj
