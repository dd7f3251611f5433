"""Ending every process below this one, before this one leaves without its usual shutdown.

A worker that exits with ``os._exit`` (the stall watchdog) runs none of the clean-ups that end its
children: a DataLoader worker process hung in the data set's code never looks at its parent again
(torch's loader workers notice a dead parent only between samples), so it would run on as an orphan,
holding its memory, for good. Other children (the checkpoint writer, data-parallel ranks and their
own loader workers) go too: the job is abandoned, and whatever they would still commit is either
fenced out or recovered by the next attempt, exactly as after a SIGKILL of the whole worker.

Linux only (``/proc``); elsewhere nothing is done.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

PROC = Path("/proc")
ROUNDS_MAX = 10
"""Scans for processes forked meanwhile; each round freezes what it found, so they stop forking."""


def parents() -> dict[int, int]:
    """pid -> parent pid of every process visible now."""
    parents = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold ")"
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
    return parents


def descendants(root: int) -> set[int]:
    """Every process below ``root`` (children, theirs, ...), as /proc shows them now."""
    found_parents = parents()
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in found_parents.items() if parent in frontier} - found
        found |= frontier
    return found


def kill_descendants(root: int = 0) -> set[int]:
    """SIGKILL every process below ``root`` (this process by default); the pids signalled.

    They are frozen first (SIGSTOP), round after round until a scan finds no new one: a process
    killed before its children would hand them to init, out of reach, and one still running may
    fork after the scan. Not waited for: the kernel ends a SIGKILLed process at once, and its
    parent (this one) is about to exit, so init reaps it."""
    if not PROC.is_dir():
        return set()
    root = root or os.getpid()
    frozen: set[int] = set()
    for _ in range(ROUNDS_MAX):
        new = descendants(root) - frozen
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        frozen |= new
    for pid in frozen:
        _signal(pid, signal.SIGKILL)
    return frozen


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):  # gone already, or not ours to end
        pass
