"""Whether a process of this machine still exists (for what a process killed outright left behind)."""
from __future__ import annotations

import os


def process_exists(pid: int) -> bool:
    """True while ``pid`` names a process here, another user's included (signal 0 checks, sends nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
