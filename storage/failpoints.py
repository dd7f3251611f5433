"""Named points where a process dies on purpose, for tests of what survives a crash there (as etcd's
gofail or FreeBSD's fail points): nothing happens unless ``BATON_FAILPOINT`` names the point.

``BATON_FAILPOINT=NAME@STEP[:ONCE]``: the process SIGKILLs itself at point NAME of optimizer step STEP;
with ONCE (a file path), only the first process to get there does (it creates the file).
Points: ``memory-copy-torn`` (``memory_copy``: halfway through an in-memory copy, some of the new
state written into a slot and the rest not).
"""
from __future__ import annotations

import os
import signal

ENV = "BATON_FAILPOINT"


def armed(name: str, step: int) -> bool:
    """Whether ``name`` should fire at ``step`` in this process (claiming its ONCE file if it has one)."""
    setting = os.environ.get(ENV)
    if not setting:
        return False
    point, _, rest = setting.partition("@")
    at, _, once = rest.partition(":")
    if point != name or not at.isdigit() or int(at) != step:
        return False
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return False
    return True


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
