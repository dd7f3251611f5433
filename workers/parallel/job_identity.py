"""A job's processes as a user of their own: the worker's side grants them its directories, their side
drops to that user (``become``) before anything of the job runs.

A worker that can change user (root, or ``CAP_SETUID`` and ``CAP_SETGID``) runs each job's code as an
identity chosen for it (``baton.workers.attempt.job_users``): its training process drops to it as its first
act, and a follower node's ranks as theirs, so everything the job's code starts (its ranks, its
checkpoint writer, its data loader workers, any process of its own) is that user. As that user it cannot
read the worker's ``/proc/<pid>/environ`` or memory, signal it, or write the worker's files.

The few directories the job must use and the worker makes (its copies in memory, its store gate's socket,
its shipped code, a follower's private directory) stay the worker's and are lent to the job's group
(``grant``): the worker can always remove them, and sweep them when the job's processes are gone.
"""
from __future__ import annotations

import ctypes
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Optional, Union

from baton.schemas.messages import JobIdentity

PR_SET_DUMPABLE = 4
READ = stat.S_IRGRP | stat.S_IXGRP
WRITE = READ | stat.S_IWGRP | stat.S_ISVTX
"""A directory the job writes in: its group may add files, and remove only its own (sticky)."""
SOCKET = stat.S_IRGRP | stat.S_IWGRP
"""A socket the job connects to."""


def become(identity: Optional[JobIdentity]) -> None:
    """Drop this process to ``identity`` for good (no supplementary group, no way back), its HOME and
    temporary directory its own; nothing where there is no identity or this process is it already.

    It must come first: the kernel clears a parent-death signal (``PR_SET_PDEATHSIG``) when credentials
    change. A process whose credentials changed is made undumpable by the kernel, which would hide its
    own ``/proc/self`` from it: it is made dumpable again (only the job's own processes share its user)."""
    if identity is None or os.geteuid() == identity.uid:
        return
    _leave_parents_helpers()
    os.setgroups([])
    os.setresgid(identity.gid, identity.gid, identity.gid)
    os.setresuid(identity.uid, identity.uid, identity.uid)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    os.umask(0o077)
    os.environ.update(HOME=identity.home, TMPDIR=identity.home, USER=identity.name, LOGNAME=identity.name)
    tempfile.tempdir = None  # (computed again from TMPDIR)


def _leave_parents_helpers() -> None:
    """Let go of what multiprocessing handed down from the worker's forkserver: the write end of its
    resource tracker (a root process that unlinks whatever ``/dev/shm`` name it is told to when it ends)
    and its temporary directory (the worker's, which the job could not bind a socket in: a data loader
    worker sharing a tensor's file descriptor does). The job's own are made again when it needs them."""
    from multiprocessing import process, resource_tracker

    tracker: Any = resource_tracker._resource_tracker  # (its fields are private: 3.10 to 3.13 name them so)
    if getattr(tracker, "_fd", None) is not None:
        try:
            os.close(tracker._fd)
        except OSError:
            pass
        tracker._fd, tracker._pid = None, None
    getattr(process.current_process(), "_config", {}).pop("tempdir", None)


def grant(path: Union[str, Path], identity: Optional[JobIdentity], mode: int = WRITE) -> None:
    """Lend the directory (or socket) ``path`` to ``identity``'s group: its owner, and the owner's own
    permissions, stay as they are. ``mode``: what the group may do (``READ``, ``WRITE``); nothing where
    there is no identity to lend to."""
    if identity is None or os.geteuid() == identity.uid:
        return
    os.chown(path, -1, identity.gid, follow_symlinks=False)
    os.chmod(path, os.stat(path, follow_symlinks=False).st_mode & stat.S_IRWXU | mode)


def take_back(path: Union[str, Path]) -> None:
    """``path`` back to this process's user alone (a lent code directory the next job, of another team,
    must not read)."""
    os.chown(path, -1, os.getegid(), follow_symlinks=False)
    os.chmod(path, os.stat(path, follow_symlinks=False).st_mode & stat.S_IRWXU)


def readable_inside(path: Union[str, Path]) -> None:
    """Everything under the directory ``path`` (not itself, which decides who may enter) readable by all:
    files this process fetched as private temporary files, for a job's processes to read (a checkpoint)."""
    for top, dirs, names in os.walk(path):
        for name in dirs:
            os.chmod(os.path.join(top, name), 0o755)
        for name in names:
            os.chmod(os.path.join(top, name), 0o644)
