"""What a slot's uid leaves on this machine after an attempt, found and ended: its processes (``running_as``,
``end_processes``) and what it wrote where every user may write (``remove_files``). The uid is this worker
process's alone (``job_users``), so all of it is the job's: the next job on the worker, of another team,
runs as the same uid and must find none of it.
"""
from __future__ import annotations

import os
import shutil
import signal
import stat
from pathlib import Path

PROC = Path("/proc")
SHARED_PLACES = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), Path("/dev/mqueue"))
"""Where any user may make files (sticky, world-writable): searched, and their world-writable
directories in turn, for what the uid made."""
KILL_ROUNDS = 10_000


def running_as(uid: int) -> list[int]:
    """The pids of the live processes (zombies are dead) whose real or effective user is ``uid``."""
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                lines = (entry / "status").read_text().splitlines()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in lines if ":" in line)
            if fields.get("State", "").split()[:1] != ["Z"] and str(uid) in fields.get("Uid", "").split()[:2]:
                found.append(int(entry.name))
    return found


def end_processes(uid: int) -> list[int]:
    """Every process of ``uid`` SIGKILLed; those seen before (their pids). The kill is sent by a child of this
    process that has become ``uid`` (``kill(-1)`` reaches each process of its user at once, a fork under way
    included), again until none is left: a job's processes cannot outrun it by forking, as they could a kill by
    pid. ``OSError`` if some survive it (never seen)."""
    seen = running_as(uid)  # (a process forking again and again may be missed here: not by the kill)
    child = os.fork()
    if child == 0:  # (system calls and /proc alone here: this process may have other threads)
        code = 1
        try:
            os.setgroups([])
            os.setresuid(uid, uid, uid)
            for round in range(KILL_ROUNDS):
                os.kill(-1, signal.SIGKILL)  # (a fork under way when it comes makes no child)
                if round % 4 == 3 and running_as(uid) == [os.getpid()]:  # only zombies are left (signalled, never gone)
                    code = 0
                    break
        except ProcessLookupError:
            code = 0  # none left
        except BaseException:
            pass
        os._exit(code)
    _, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status) != 0 or running_as(uid):
        raise OSError(f"processes of uid {uid} outlived {KILL_ROUNDS} SIGKILLs: {running_as(uid)}")
    return seen


def remove_files(uid: int, places=SHARED_PLACES) -> list[Path]:
    """What ``uid`` made in ``places`` (and in the world-writable directories under them) removed, without
    following a link it planted; the paths removed."""
    removed: list[Path] = []
    for place in places:
        _sweep(place, uid, removed, depth=0)
    return removed


def _sweep(directory: Path, uid: int, removed: list[Path], depth: int) -> None:
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        path = Path(entry.path)
        if info.st_uid == uid:
            try:
                if stat.S_ISDIR(info.st_mode):
                    shutil.rmtree(path)  # (descriptor-based: a link inside is removed, never followed)
                else:
                    path.unlink()
                removed.append(path)
            except OSError:
                pass
        elif stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_IWOTH and depth < 8:
            _sweep(path, uid, removed, depth + 1)  # (another's directory the uid could write in)
