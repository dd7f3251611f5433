"""Removing the scratch directories of processes killed outright, when a worker or a run starts.

An attempt keeps its checkpoint spool (a whole serialized checkpoint at times), TensorBoard's
local event files and its ranks' rendezvous in directories that it removes when it ends. A process killed outright cannot:
its directories stay until the next worker process or ``baton run`` started on the machine (and
every attempt's start) removes them. Each directory is named after its owning process
(``baton.storage.owned_dirs``), so those of a live process, or of another machine sharing a file://
store's scratch directory, are kept.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from baton.storage import owned_dirs
from baton.storage.stores.base import ObjectStore
from baton.workers.tracking.tensorboard import LOCAL_DIR_PREFIX

PREFIXES = (owned_dirs.SPOOL_PREFIX, LOCAL_DIR_PREFIX, owned_dirs.RANKS_PREFIX, owned_dirs.GATE_PREFIX,
            owned_dirs.HOME_PREFIX)


def remove_orphaned_scratch(store: Optional[ObjectStore], log: Callable[[str], None]) -> list[Path]:
    """Remove the dead processes' scratch directories in the temporary directory and in ``store``'s
    scratch directory (a file:// store's spool is there); those removed, each logged."""
    places: list[Optional[Path]] = [None]
    scratch = store.scratch_dir() if store is not None else None
    if scratch is not None:
        places.append(scratch)
    removed = [path for place in places for path in owned_dirs.remove_orphans(place, PREFIXES)]
    for path in removed:
        log(f"removed {path}: left by a process that is gone (killed outright)")
    return removed
