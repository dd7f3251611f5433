"""Facts about this machine's processes: whether one still exists (for what a process killed outright
left behind), and the cgroup this one runs in (its memory limit and OOM kills)."""
from __future__ import annotations

import os
from pathlib import Path


def process_exists(pid: int) -> bool:
    """True while ``pid`` names a process here, another user's included (signal 0 checks, sends nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def own_cgroup() -> Path:
    """This process's cgroup v2 directory (its memory.max, memory.current, memory.events); OSError or
    IndexError where there is none to read."""
    line = Path("/proc/self/cgroup").read_text().splitlines()[0]
    return Path("/sys/fs/cgroup") / line.split("::", 1)[1].lstrip("/")
