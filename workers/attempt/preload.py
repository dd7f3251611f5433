"""Imported by a worker's forkserver before it forks any training process (``process.py``): what every
attempt imports, and one tiny training step on one thread, paid once instead of in every start.

Nothing here may initialise CUDA (a CUDA context does not survive a fork) or start torch's intra-op
thread pool (threads do not survive a fork either): the step runs on the CPU with one thread, and
each training process sets its own count (``determinism.configure``). (Importing numpy starts
OpenBLAS's thread pool, which re-initialises itself in a forked child.)
"""
from __future__ import annotations

import atexit
import os
import signal
import sys

import torch

# a SIGTERM sent to the whole process group (systemd, an init, `kill -- -PGID`) is the worker's to act
# on (checkpoint, hand over): the forkserver dying of it would take the training process with it
# (PR_SET_PDEATHSIG), unsaved. The forkserver still ends when the worker does (its pipe closes).
signal.signal(signal.SIGTERM, signal.SIG_IGN)

from baton.workers.training.determinism import prepare_process  # noqa: E402  (reads torch's default first)

torch.set_num_threads(1)
prepare_process()

from baton.storage.checkpointing import writer_process  # noqa: E402,F401
from baton.storage.memory import memory_copy  # noqa: E402,F401
from baton.workers.attempt.warmup import warm_up  # noqa: E402

from baton.workers.tracking import tensorboard  # noqa: E402

from baton.workers.attempt import child  # noqa: E402,F401  (the session, the loop, the trackers)

tensorboard.preload()
warm_up(os.environ.get("BATON_STORAGE_URL", ""))

_FORKSERVER = os.getpid()


def _exit_without_finalising() -> None:
    """The forkserver ends (its worker's pipe closed) as the interpreter would, less the finalisation of
    its modules: tearing down torch, torch._dynamo and the trackers' libraries costs ~2 s of a core at
    every worker's stop, and a fork server holds nothing that finalisation would save. The other exit
    handlers still run (multiprocessing's among them), then the streams are flushed. Registered last, so
    run first; a process forked from the forkserver that reaches the exit handlers (they are inherited)
    finalises as usual."""
    if os.getpid() != _FORKSERVER:
        return
    atexit.unregister(_exit_without_finalising)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(0)


atexit.register(_exit_without_finalising)
