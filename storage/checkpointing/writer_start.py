"""Starting a checkpoint writer process (``writer_process.py``) ahead of its checkpointer.

A writer started as a new interpreter spends its first ~1.8 s of a core importing torch. Started when
the checkpointer is made, that import ran beside the first epochs; on two cores with a loop of two
intra-op threads, whose threads wait on each other at every operation, it made each of the first ~20
epochs of the spiral example 2-6x slower (1.2-1.6 s of wall time a run, bench/loop_ablation.py).
So a process that has imported torch and started no thread yet (``baton run`` once its imports are
done, a worker's training process as it starts) forks its writer instead (``fork_spare``): torch is
imported already, nothing is paid again. Elsewhere ``prestart()`` starts one while the process is
itself still starting: both imports run at once, one on each core, and the writer waits, idle, for
its checkpointer's configuration.

This module imports nothing heavy: it runs before torch is imported. A spare that no checkpointer
takes (the job had finished already, or the thread writer was chosen) exits when its pipe closes:
when this process exits, or at ``discard()``. A training process forked from a worker's forkserver has
torch imported and no thread yet: it forks its spare instead (``fork_spare``), which imports nothing.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Optional

from baton.storage import forked

PACKAGE_ROOT = Path(sys.modules[__name__.split(".")[0]].__file__ or ".").resolve().parents[1]
"""The folder ``baton`` is imported from (a checkout, or site-packages): first on the writer's path."""
WRITER_ENV = "BATON_CHECKPOINT_WRITER"
"""``process`` (the default where it can be), or ``thread``: where a checkpoint's commit runs."""


@dataclass
class StartedWriter:
    proc: "subprocess.Popen | forked.ForkedChild"
    to_child: Connection
    from_child: Connection
    nice: int


_spare: Optional[StartedWriter] = None


def start(nice: int) -> StartedWriter:
    """A writer process, importing what it needs at ``nice``, then waiting for its configuration."""
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "baton.storage.checkpointing.writer_process", str(to_child_r),
                                 str(from_child_w), str(os.getpid()), str(nice)],
                                pass_fds=(to_child_r, from_child_w), env=env)
    except BaseException:
        for fd in (to_child_w, from_child_r):
            os.close(fd)
        raise
    finally:
        os.close(to_child_r)
        os.close(from_child_w)
    return StartedWriter(proc, Connection(to_child_w, readable=False), Connection(from_child_r, writable=False), nice)


def prestart() -> None:
    """Start this process's spare writer now, unless one is started or the settings choose the thread
    writer (a setting that is not valid is left for the checkpointer to refuse)."""
    global _spare
    from baton.storage.checkpointing.priority import background_nice

    if _spare is not None or os.environ.get(WRITER_ENV, "process").strip() == "thread":
        return
    try:
        _spare = start(background_nice())
    except (ValueError, OSError):
        _spare = None


def fork_spare() -> None:
    """Fork this process's spare writer, where this process has imported torch and started no thread yet (a
    training process just forked from its worker's forkserver): the writer then has torch already, instead
    of a new interpreter importing it (about 1-2 s of a core an attempt). Elsewhere (a thread runs, the
    settings choose the thread writer): as ``prestart``, or nothing."""
    global _spare
    from baton.storage.checkpointing.priority import background_nice

    if _spare is not None or os.environ.get(WRITER_ENV, "process").strip() == "thread":
        return
    if not forked.may_fork():  # (a fork copies one thread; no torch: no gain)
        prestart()
        return
    try:
        nice = background_nice()
    except ValueError:
        return  # (the checkpointer refuses the setting, naming it)
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    parent = os.getpid()

    def write() -> int:
        from baton.storage.checkpointing import writer_process

        writer_process.main(["writer", str(to_child_r), str(from_child_w), str(parent), str(nice)])
        return 0

    child = forked.fork(WRITER_NAME, {to_child_r, from_child_w}, write)
    os.close(to_child_r)
    os.close(from_child_w)
    _spare = StartedWriter(child, Connection(to_child_w, readable=False),
                           Connection(from_child_r, writable=False), nice)


WRITER_NAME = "baton-writer"
"""The name a forked writer goes by (``/proc/PID/comm``, ``ps -o comm``): its command line is its parent's."""


def is_writer(pid: int) -> bool:
    """Whether process ``pid`` is a checkpoint writer: started as one (its command line) or forked (its name)."""
    try:
        with open(f"/proc/{pid}/comm") as comm, open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return comm.read().strip() == WRITER_NAME or b"baton.storage.checkpointing.writer_process" in cmdline.read()
    except OSError:
        return False


def take(nice: int) -> StartedWriter:
    """The spare when it was started at ``nice``, else a new writer."""
    global _spare
    spare, _spare = _spare, None
    if spare is not None and spare.nice == nice and spare.proc.poll() is None:
        return spare
    if spare is not None:
        _end(spare)
    return start(nice)


def discard() -> None:
    """End the spare, if any (no process writer will be made here)."""
    global _spare
    spare, _spare = _spare, None
    if spare is not None:
        _end(spare)


def _end(spare: StartedWriter) -> None:
    spare.to_child.close()  # it exits at the closed pipe, imports done or not
    spare.from_child.close()
    spare.proc.kill()
    spare.proc.wait()
