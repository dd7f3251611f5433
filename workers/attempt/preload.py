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
warm_up()

_FORKSERVER = os.getpid()


def _exit_without_finalising() -> None:
    """The forkserver ends (its worker's pipe closed) as the interpreter would, less the finalisation of
    its modules: tearing down torch, torch._dynamo and the trackers' libraries costs ~2 s of a core at
    every worker's stop, and a fork server holds nothing that finalisation would save.

    Registered last, so called first: the exit handlers registered before it (multiprocessing's,
    logging's) are run from here, then the streams are flushed and the process leaves with the status
    the interpreter would give (1 after an uncaught exception: ``sys.last_type``; the forkserver's own
    end is a bare ``SystemExit``, 0). Where a handler was registered after this one (already called,
    CPython does not drop it from the list) the interpreter finalises as usual rather than call it twice;
    so does any process but the forkserver (its children leave by ``os._exit`` and never get here)."""
    if os.getpid() != _FORKSERVER or atexit._ncallbacks() != _REGISTERED:
        return
    atexit.unregister(_exit_without_finalising)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(1 if getattr(sys, "last_type", None) is not None else 0)


atexit.register(_exit_without_finalising)
_REGISTERED = atexit._ncallbacks()  # (the count only grows until exit: unregistering leaves a gap)
