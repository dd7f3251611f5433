"""The directories that hold a job's copies in memory (``memory_slots`` reads them, ``memory_copy``
writes them), as the worker's main process keeps them: made for a job's first training process, kept
for the next (``JobMemory``), removed when the job leaves the worker; those of a worker killed outright
swept by the next (``remove_orphans``). One on /dev/shm, RAM that outlives the training process, and
one on disk for the buffers /dev/shm has no room for, each named after the worker (``owned_dirs``).
Nothing here imports torch: a worker's main process does not."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Collection, Optional

from baton.storage import owned_dirs

PREFIX = "baton-memory-"
"""The directories' names (``owned_dirs``: those of an agent killed outright are swept)."""
SHM = owned_dirs.SHM


def make_dirs() -> list[Path]:
    """The directories for one job's copies: on /dev/shm when there is one, and on disk (the temporary
    directory) for the buffers /dev/shm has no room for. Named after this process (``owned_dirs``)."""
    bases = ([SHM] if owned_dirs.writable(SHM) else []) + [Path(tempfile.gettempdir())]
    return [owned_dirs.make(PREFIX, base, held=base == SHM) for base in bases]


def remove_dirs(dirs: Collection[Path]) -> None:
    for directory in dirs:
        owned_dirs.remove(directory)


def remove_orphans() -> list[Path]:
    """The directories of agents that are gone (killed outright), removed."""
    return [path for place in (SHM, None) for path in owned_dirs.remove_orphans(place, (PREFIX,))]


class JobMemory:
    """A job's copy directories on this worker: made for its first training process, kept for the next,
    removed when the job leaves the worker."""

    def __init__(self) -> None:
        self.dirs: Optional[list[str]] = None

    def get(self) -> list[str]:
        if self.dirs is None:
            self.dirs = [str(d) for d in make_dirs()]
        return self.dirs

    def remove(self) -> None:
        if self.dirs is not None:
            remove_dirs([Path(d) for d in self.dirs])
