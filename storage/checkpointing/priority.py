"""Background work that may yield to training: a thread lowers its own scheduling priority.

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

NICE_ENV = "BATON_BACKGROUND_NICE"
"""How far below the training thread the checkpoint and TensorBoard threads run (0-19; default
0: off). +10 weighs about a tenth of nice 0 under CFS, so training keeps ~90 % of a core it shares
with them. Off by default because niceness is also lost against every *other* process: on a
machine busy with other work a niced commit is starved (at load 7 on 2 cores, periodic
checkpoints were skipped until epoch ends, and tests that kill a run after two mid-epoch commits
ran out of them), and a loop that must wait for a commit (epoch end, SIGTERM with its grace
period) then waits longer; an unprivileged thread cannot raise its priority back for that wait.
Turn it on for a node that runs nothing but the job."""


def background_nice() -> int:
    value = os.environ.get(NICE_ENV, "0").strip() or "0"
    try:
        nice = int(value)
    except ValueError:
        raise ValueError(f"{NICE_ENV}={value!r}: expected an integer 0-19") from None
    if not 0 <= nice <= 19:
        raise ValueError(f"{NICE_ENV}={nice}: expected an integer 0-19")
    return nice


def lower_this_thread(increment: Optional[int] = None) -> Optional[int]:
    """Lower the calling thread's priority by ``increment`` (default: ``BATON_BACKGROUND_NICE``;
    Linux only); its new nice value, or None when nothing was changed."""
    if increment is None:
        increment = background_nice()
    if not sys.platform.startswith("linux") or increment <= 0:
        return None
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + increment))
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:  # a sandbox that forbids it: the work runs at the normal priority
        return None
