"""Background work that yields to training: a thread lowers its own scheduling priority.

On Linux every thread is a task with its own nice value, and ``setpriority(PRIO_PROCESS, tid)``
changes that thread alone: the training thread (and torch's intra-op threads) keep theirs. When
the cores are busy, the scheduler then gives training the CPU first and the checkpoint's
serialization, hashing and upload the rest; when they are idle the background thread runs at
full speed. Raising a priority back needs CAP_SYS_NICE, so it is lowered once, for the thread's
life. Elsewhere (macOS's setpriority would nice the whole process) nothing is changed.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Optional

BACKGROUND_NICE_INCREMENT = 10
"""How far below the training thread a background thread runs: nice +10 weighs about a tenth of
nice 0 under CFS, so a busy training thread keeps ~90 % of a contended core, and the background
work still progresses (at +19 it would get ~1.5 % and a checkpoint could be starved for minutes)."""


def lower_this_thread(increment: int = BACKGROUND_NICE_INCREMENT) -> Optional[int]:
    """Lower the calling thread's priority by ``increment`` (Linux only); its new nice value, or
    None when nothing was changed."""
    if not sys.platform.startswith("linux") or increment <= 0:
        return None
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + increment))
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:  # a sandbox that forbids it: the work runs at the normal priority
        return None
