"""Named points where a process dies or waits on purpose, for tests of what survives a crash there (as
etcd's gofail or FreeBSD's fail points): nothing happens unless the environment arms them.

``BATON_FAILPOINT=NAME@STEP[:ONCE]``: the process SIGKILLs itself at point NAME of optimizer step STEP;
with ONCE (a file path), only the first process to get there does (it creates the file).
Points: ``memory-copy-torn`` (``memory_copy``: halfway through an in-memory copy, some of the new
state written into a slot and the rest not).

``BATON_FAILPOINT_PAUSE=DIR``: while ``DIR/off`` does not exist, a process at a pause point creates
``DIR/<point>.<job>.<pid>.<n>`` and waits until that file is removed (or ``off`` appears, or
``PAUSE_LIMIT_S`` passes): a test reads what the job has committed, then kills it or lets it go on, and
no commit can slip between the two. Points: ``commit`` (``manifest_store``: before every change of a
job's manifest: its claims, checkpoint commits and completion). While a test holds them, a periodic
checkpoint that finds the one before still in flight waits for it instead of being skipped
(``checkpointer.py``, ``held``): every checkpoint a spec asks for is taken and offered to the test,
however slowly the machine runs, so a state the test waits for cannot be skipped past.
"""
from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

ENV = "BATON_FAILPOINT"
PAUSE_ENV = "BATON_FAILPOINT_PAUSE"
PAUSE_LIMIT_S = 300.0
"""A paused process goes on by itself after this long (a test that died leaves no job waiting for ever)."""

_pauses = itertools.count()


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


def held() -> bool:
    """Whether a test holds the pause points now (``BATON_FAILPOINT_PAUSE`` set, its ``off`` absent)."""
    setting = os.environ.get(PAUSE_ENV)
    return setting is not None and setting != "" and not (Path(setting) / "off").exists()


def pause(point: str, job_id: str) -> None:
    """Wait at ``point`` of ``job_id`` while a test holds it (``BATON_FAILPOINT_PAUSE``); else return at once."""
    setting = os.environ.get(PAUSE_ENV)
    if not setting:
        return
    folder = Path(setting)
    off = folder / "off"
    if off.exists():
        return
    waiting = folder / f"{point}.{job_id}.{os.getpid()}.{next(_pauses)}"
    try:
        waiting.touch()
    except OSError:  # the test's folder is gone: nobody holds this point
        return
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while waiting.exists() and not off.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    waiting.unlink(missing_ok=True)
