"""What a slot's uid leaves on this machine after an attempt, found and ended: its processes, what it made
where every user may write, its System V IPC objects and its kernel keyring. The uid is this worker
process's alone (``job_users``), so all of it is the job's: the next job on the worker, of another team,
runs as the same uid and must find none of it.

A ``Clearer`` runs this file as a new interpreter (``python -I -S``: the standard library alone, no
environment, nothing of the worker's threads), started ahead and waiting for its uid on stdin, which,
as root, drops to real and saved uid ``KILLER_UID``
and effective uid ``uid``: it may signal the job's processes, and they, whose uid is neither of its
real or saved ones, may not signal or trace it. It sends ``kill(-1, SIGKILL)`` until none is left (a
kill reaches every process of the uid at once, a fork under way included: one that forks again and again
cannot outrun it as it could a kill by pid). Then, with nothing of the uid left to act on it, it becomes
the uid wholly and removes what the uid made, with the uid's own rights alone (a link the job planted
leads nowhere a root process would follow it).
"""
from __future__ import annotations

import os
import stat
import sys

# (the interpreter that clears a uid, on the path from one attempt to the next, imports only what it uses)
PROC = "/proc"
SIGKILL = 9  # (the signal module's import is the dearest of all here)
KILLER_UID = 2**32 - 2
"""``(uid_t) -2``: no account's, no process's, never a slot (``job_users``)."""
SHARED_PLACES = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue", "/run/lock")
"""Where any user may make files (sticky, world-writable): searched for what the uid made there. A
directory of another user's that lets all write in it (a drop box) is that user's to keep: what the job
put there stays."""
KILL_ROUNDS = 10_000
TIMEOUT_S = 60.0
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
_KEYCTL_CLEAR, _KEY_SPEC_USER_KEYRING, _KEY_SPEC_USER_SESSION_KEYRING = 7, -4, -5
_IPC_RMID = 0


def running_as(uid: int) -> list[int]:
    """The pids of the live processes (zombies are dead) whose real or effective user is ``uid``."""
    found = []
    for name in os.listdir(PROC):
        if name.isdigit():
            try:
                with open(f"{PROC}/{name}/status") as status:
                    lines = status.read().splitlines()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in lines if ":" in line)
            if fields.get("State", "").split()[:1] != ["Z"] and str(uid) in fields.get("Uid", "").split()[:2]:
                found.append(int(name))
    return found


class Clearer:
    """A clearing interpreter started before it is needed, waiting for the uid on its stdin: its start is
    most of a clear's cost, so the worker keeps one ready for after each attempt. ``keep``: file descriptors
    it holds while it lives (the slot's lock: no other worker takes the uid until its clear has ended, even
    one whose worker was killed). It runs nothing until told; closed, it exits. It is in a session of its
    own: a signal to the worker's process group (a Ctrl-C, a stop of the whole group) that the worker acts
    on gracefully must not end the process that clears after the attempt the worker stops."""

    def __init__(self, keep: tuple[int, ...] = ()):
        import subprocess

        self._proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__)], env={},
                                      stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True, pass_fds=keep, start_new_session=True)

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def clear(self, uid: int, places: "tuple[str, ...] | list[str]" = ()) -> None:
        """Every process of ``uid`` ended, and what it made in ``SHARED_PLACES`` (and ``places``) and in
        System V IPC removed (module doc). ``OSError`` saying why where it could not be. Once only."""
        import subprocess

        try:
            _, said = self._proc.communicate("\n".join([str(uid), *places]), timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            raise OSError(f"clearing uid {uid} took over {TIMEOUT_S:g}s") from None
        if self._proc.returncode != 0:
            raise OSError(f"clearing uid {uid} failed: {(said.strip().splitlines() or ['?'])[-1]}")

    def close(self) -> None:
        """Its end, unused (it reads an empty stdin and exits)."""
        if self._proc.poll() is None:
            self._proc.communicate("", timeout=TIMEOUT_S)


def _end_processes(uid: int) -> None:
    """As ``KILLER_UID`` with effective uid ``uid``: SIGKILL to every process of ``uid`` until none is left."""
    for round in range(KILL_ROUNDS):
        try:
            os.kill(-1, SIGKILL)  # (a fork under way when it comes makes no child)
        except ProcessLookupError:
            return  # none left
        if round % 4 == 3 and running_as(uid) == [os.getpid()]:  # only zombies (signalled, never gone)
            return
    raise OSError(f"processes of uid {uid} outlived {KILL_ROUNDS} SIGKILLs: {running_as(uid)}")


def remove_files(uid: int, places: list[str]) -> list[str]:
    """What ``uid`` made in ``places`` removed (its directories whole); the paths. Run as ``uid`` (``_main``):
    what the uid's own rights cannot remove stays."""
    removed: list[str] = []
    for place in places:
        try:
            entries = list(os.scandir(place))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
                if info.st_uid != uid:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    import shutil

                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed.append(entry.path)
            except OSError:
                pass
    return removed


def remove_ipc(uid: int) -> None:
    """This uid's System V shared memory, message queues and semaphores removed (as their owner)."""
    for kind, key in (("shm", "shmid"), ("msg", "msqid"), ("sem", "semid")):
        try:
            with open(f"{PROC}/sysvipc/{kind}") as table:
                header, *rows = table.read().splitlines()
        except (OSError, ValueError):
            continue
        names = header.split()
        for row in rows:
            values = dict(zip(names, row.split()))
            if str(uid) in (values.get("uid"), values.get("cuid")) and key in values:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                ident = int(values[key])
                libc.semctl(ident, 0, _IPC_RMID) if kind == "sem" else getattr(libc, f"{kind}ctl")(ident, _IPC_RMID, None)


def clear_keyrings(uid: int) -> None:
    """This (the uid's) user keyrings emptied, where it holds keys (``/proc/key-users``) and the kernel lets a
    process use keyrings at all."""
    try:
        with open(f"{PROC}/key-users") as users:  # ("UID: USAGE NKEYS/NIKEYS ...": its two keyrings are keys too)
            holds = any(line.split(":", 1)[0].strip() == str(uid) and _count(line.split(":", 1)[1]) > 2 for line in users)
    except OSError:
        return
    number = _SYS_KEYCTL.get(os.uname().machine)
    if holds and number is not None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        for ring in (_KEY_SPEC_USER_KEYRING, _KEY_SPEC_USER_SESSION_KEYRING):
            libc.syscall(number, _KEYCTL_CLEAR, ring)


def _count(fields: str) -> int:
    try:
        return int(fields.split()[1].split("/")[0])
    except (IndexError, ValueError):
        return 3  # (a line of another shape: cleared to be sure)


def _main(uid: int, places: list[str]) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(KILLER_UID, uid, KILLER_UID)
    _end_processes(uid)
    os.setresuid(uid, uid, uid)  # (nothing of the uid is left to signal or trace this process)
    remove_files(uid, list(dict.fromkeys([*SHARED_PLACES, *places])))
    remove_ipc(uid)
    clear_keyrings(uid)


if __name__ == "__main__":
    told = sys.stdin.read().split("\n")  # (the uid, then the places; nothing: closed unused)
    if told[0]:
        _main(int(told[0]), [place for place in told[1:] if place])
