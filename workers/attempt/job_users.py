"""Which user a worker's jobs run as (``BATON_JOB_USER``), and what each attempt is lent as that user.

- unset (the default): where the worker may change user (root), a uid of its own per worker process (a
  *slot*) from ``BATON_JOB_UIDS``: the first that no account or group of the machine has, that no process
  runs as, and that no other worker holds (it flocks ``<uid>.lock`` in ``/run/baton-job-uids``, a directory
  only its user may write in, for as long as it lives). Its group is the same number. Where it may not, the
  worker's own user (below). A worker that may change user never falls back to its own quietly: where a job's
  user could not read what jobs import (this Python, baton, the worker's directory, its ``PYTHONPATH``), it
  refuses to start, naming the path.
- ``A-B``: slots from that range of uids.
- a user's name, ``UID`` or ``UID:GID``: that user for every job; a worker that cannot change user refuses
  to start. The operator gives each worker its own (processes of a shared one are not ended by uid).
- ``worker``: the worker's own user: a job's code can then read the worker's credentials (its ``/proc``
  environ and memory), signal it, and write whatever it can write. Said once at start and by ``baton health``.

Each attempt gets a HOME of its own (also its temporary directory), made empty and removed after it. After
a slot's attempt, every process of the slot's uid is killed and what it made where all users may write
(``/tmp``, ``/var/tmp``, ``/dev/shm``...) and in System V IPC is removed (``uid_leftovers``: none of it can be
another's, the uid is this worker's alone), so the next job, of another team, finds nothing of it. That
clear runs beside what the worker does next (the attempt's release, the next claim), by an interpreter
started ahead for it; the next attempt is lent the uid only once it has ended.

With the file store, the store's directory must be closed to other users (``check_store``): a job's user
reaches its objects only through its store gate.
"""
from __future__ import annotations

import contextlib
import fcntl
import grp
import logging
import os
import pwd
import stat
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional
from urllib.parse import urlparse

from baton.schemas.messages import JobIdentity
from baton.schemas.settings import DEFAULT_JOB_UIDS
from baton.storage import owned_dirs
from baton.workers.attempt import uid_leftovers
from baton.workers.attempt.uid_leftovers import running_as
from baton.workers.parallel.job_identity import READ, SOCKET, WRITE, grant, take_back

_log = logging.getLogger("baton.worker")
HOME_PREFIX = owned_dirs.HOME_PREFIX
"""An attempt's HOME (``owned_dirs``): the worker's directory, holding the job's own ``home``."""
WORKER = "worker"
DEFAULT_UIDS = DEFAULT_JOB_UIDS
LOCK_DIRS = (Path("/run/baton-job-uids"), Path(tempfile.gettempdir()) / f"baton-job-uids-{os.geteuid()}")
"""Where the slots' locks are kept: the first that is, or can be made, a directory of this user's alone
(the second where /run is not writable)."""
LOCK_NAME = "{}.lock"
PROC = Path("/proc")
WARM_AFTER_S = 2.0
"""How long after a clear the next clearing interpreter is started: not while the next attempt's training
process starts (on a small machine they would share its cores)."""


class JobUserError(ValueError):
    """BATON_JOB_USER or BATON_JOB_UIDS cannot be honoured on this machine (one line: what and why)."""


def may_change_user() -> bool:
    """Whether this process can run a child as another user (root, or CAP_SETUID and CAP_SETGID)."""
    if os.geteuid() == 0:
        return True
    try:
        for line in (PROC / "self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
                return bool(caps & (1 << 7)) and bool(caps & (1 << 6))  # CAP_SETUID, CAP_SETGID
    except (OSError, ValueError):
        pass
    return False


def _uid_range(text: str, setting: str) -> range:
    low, sep, high = text.partition("-")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit() or not 0 < int(low) <= int(high) < uid_leftovers.KILLER_UID:
        raise JobUserError(f"{setting}={text!r}: expected a range of uids, FIRST-LAST (e.g. {DEFAULT_UIDS})")
    return range(int(low), int(high) + 1)


def _named(text: str) -> tuple[int, int, str]:
    uid_text, _, gid_text = text.partition(":")
    try:
        account = pwd.getpwuid(int(uid_text)) if uid_text.isdigit() else pwd.getpwnam(uid_text)
    except KeyError:
        if not uid_text.isdigit():
            raise JobUserError(f"BATON_JOB_USER={text!r}: no such user on this machine") from None
        account = None
    uid = account.pw_uid if account else int(uid_text)
    if gid_text and not gid_text.isdigit():
        raise JobUserError(f"BATON_JOB_USER={text!r}: expected USER, UID or UID:GID")
    gid = int(gid_text) if gid_text else (account.pw_gid if account else uid)
    if uid == 0 or gid == 0:
        raise JobUserError(f"BATON_JOB_USER={text!r}: jobs may not run as root")
    return uid, gid, account.pw_name if account else f"baton-job-{uid}"


def unreadable_by(uid: int, gid: int) -> Optional[str]:
    """The first of the places a job's processes read (this Python, its standard library, its packages,
    baton's, the directory the worker runs in and its ``PYTHONPATH``: where a job's code is imported from)
    that ``uid``:``gid`` could not, or None (a Python installed under a private home, /root)."""
    import sysconfig

    paths = {os.path.realpath(sys.executable), *(sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")),
             str(Path(__file__).resolve().parents[2]), os.getcwd(),  # (baton's package)
             *(entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry and os.path.exists(entry))}
    for path in sorted(paths):
        blocked = _blocked_at(Path(path).resolve(), uid, gid)
        if blocked is not None:
            return f"{path} ({blocked})"
    return None


def _blocked_at(target: Path, uid: int, gid: int) -> Optional[str]:
    """Where ``uid``:``gid`` is stopped on its way to ``target`` (a directory it may not pass, a file it may not
    read: what and its mode), or None where it gets there."""
    for place in [*reversed(target.parents), target]:
        try:
            info = place.stat()
        except OSError:
            return f"{place} cannot be read"
        need = stat.S_IXOTH if place != target else stat.S_IROTH | (stat.S_IXOTH if place.is_dir() else 0)
        if info.st_uid == uid:
            need <<= 6
        elif info.st_gid == gid:
            need <<= 3
        if not info.st_mode & need:
            return f"{place} is mode {stat.filemode(info.st_mode)}"
    return None


class JobUsers:
    """This worker process's choice (module doc), made once at start (``JobUserError`` if it cannot be)."""

    def __init__(self, job_user: str = "", job_uids: str = DEFAULT_UIDS, claim: bool = True):
        """``claim``: take a slot's uid now (a worker process); without, only check the settings (``baton
        health``, ``baton worker`` before it starts its processes)."""
        self._lock_fd: Optional[int] = None
        self._dirty = False  # the slot's uid may hold what an attempt left (``lend`` clears it first)
        self._clearer: Optional[uid_leftovers.Clearer] = None  # ready for the slot's next clear
        self._guard = threading.Lock()  # (``_clearer`` and ``_lock_fd``: a timer's thread starts the next)
        self._clearing: Optional[threading.Thread] = None  # the clear after the last attempt (``lent``)
        self.slot = False  # the uid is this worker's alone (its leftovers are ended by uid)
        self.user: Optional[tuple[int, int, str]] = None  # None: the worker's own user
        self.why_not = "" if may_change_user() else f"this worker (uid {os.geteuid()}) cannot change user"
        setting = job_user.strip()
        if setting == WORKER or (not setting and not may_change_user()):
            return
        if not may_change_user():
            raise JobUserError(f"BATON_JOB_USER={setting!r}: this worker cannot change user (it runs as uid "
                               f"{os.geteuid()} without CAP_SETUID); run it as root, or unset BATON_JOB_USER")
        if not setting or (setting[0].isdigit() and "-" in setting):
            uids = _uid_range(setting or job_uids, "BATON_JOB_USER" if setting else "BATON_JOB_UIDS")
            if running_as(uid_leftovers.KILLER_UID):
                raise JobUserError(f"processes run as uid {uid_leftovers.KILLER_UID}, which this worker keeps for "
                                   "ending its jobs' processes: they would be ended with them")
            uid = self._claim(uids) if claim else uids.start
            self.user, self.slot = (uid, uid, f"baton-job-{uid}"), True
            self._uids = uids
        else:
            self.user = _named(setting)
        blocked = unreadable_by(*self.user[:2])
        if blocked is not None:  # (never a quiet fall back to this worker's user: it may change user, it is root)
            self.release()
            who = f"BATON_JOB_USER={setting!r}: that user" if setting else "jobs run as users of their own, who"
            raise JobUserError(f"{who} cannot read {blocked}: make it readable by all (jobs import from it), or set "
                               f"BATON_JOB_USER=worker to run them as this worker's user (uid {os.geteuid()})")

    def check_store(self, url: str) -> None:
        """``JobUserError`` where the store is a directory that a job's user could enter (``file://``): it would
        read every job's objects there, past its store gate. Stores of other kinds are reached with keys the
        job does not hold."""
        parsed = urlparse(url)
        if self.user is None or parsed.scheme != "file":
            return
        root = Path(parsed.netloc + parsed.path).resolve()  # (as ``open_store`` reads it)
        if root.exists() and _blocked_at(root, *self.user[:2]) is None:
            mode = stat.filemode(root.stat().st_mode)
            raise JobUserError(f"BATON_STORAGE_URL={url!r}: other users may enter that directory ({mode}), and this "
                               f"worker's jobs run as users of their own: chmod 700 {root}")

    def describe(self) -> str:
        if self.user is None:
            why = f" ({self.why_not})" if self.why_not else " (BATON_JOB_USER=worker)"
            return (f"jobs run as this worker's own user, uid {os.geteuid()}{why}: a job's code can read this worker's "
                    "credentials and signal it")
        uid, gid, name = self.user
        if self.slot and self._lock_fd is None:
            return f"jobs run as a user of their own, one uid per worker process from {self._uids.start}-{self._uids.stop - 1}"
        return f"jobs run as {name} (uid {uid}, gid {gid}{': this worker process' + chr(39) + 's alone' if self.slot else ''})"

    def _claim(self, uids: range) -> int:
        for uid in uids:
            if _known(uid):
                continue  # an account or a group of this machine's
            fd = self._lock(uid)
            if fd is None:
                continue
            if running_as(uid):  # another's (a stale slot, a container sharing this pid space)
                os.close(fd)
                continue
            self._lock_fd = fd
            self._dirty = True  # (a killed worker's slot may have left files: cleared before its first attempt)
            self._clearer = uid_leftovers.Clearer(keep=(fd,))
            return uid
        raise JobUserError(f"no free uid for this worker's jobs in {uids.start}-{uids.stop - 1} (BATON_JOB_UIDS): "
                           "each worker process holds one")

    def release(self) -> None:
        self.settle()
        with self._guard:
            if self._clearer is not None:
                self._clearer.close()
                self._clearer = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    @staticmethod
    def _lock(uid: int) -> Optional[int]:
        path = _lock_dir() / LOCK_NAME.format(uid)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_uid != os.geteuid():  # made by another user: not proof of anything
                raise OSError
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd

    def lend(self) -> Optional[JobIdentity]:
        """The identity for one attempt, with its new, empty HOME; None: the worker's own user."""
        if self.user is None:
            return None
        uid, gid, name = self.user
        self.settle()
        if self.slot and self._dirty:  # (a clear that failed, or a slot just claimed)
            self._clear_uid(uid)  # (OSError: this slot is not lent again until it is clear)
        outer = owned_dirs.make(HOME_PREFIX)
        os.chmod(outer, 0o711)
        home = outer / "home"
        home.mkdir(mode=0o700)
        os.chown(home, uid, gid)
        return JobIdentity(uid=uid, gid=gid, name=name, home=str(home))

    def clear(self, identity: Optional[JobIdentity]) -> None:
        """After the attempt (its processes ended): a slot's leftover processes killed and what it made where
        any user may write removed (``uid_leftovers``), its HOME removed. Where the slot could not be cleared,
        that is logged and the next ``lend`` tries again before lending it."""
        if identity is None:
            return
        try:
            if self.slot:
                self._clear_uid(identity.uid)
        except OSError as exc:
            _log.error("the job's user %s was not cleared after its attempt: %s", identity.name, exc)
        finally:
            owned_dirs.remove(Path(identity.home).parent)

    @property
    def dirty(self) -> bool:
        """Whether the slot may hold what an attempt left (its clear under way, failed, or not yet begun)."""
        return self._dirty or self._clearing is not None

    def _clear_uid(self, uid: int) -> None:
        self._dirty = True
        with self._guard:
            clearer, self._clearer = self._clearer, None
        if clearer is None or not clearer.alive:  # (none ready yet, or ended by another's signal)
            clearer = uid_leftovers.Clearer(self._keep())
        try:
            clearer.clear(uid, [tempfile.gettempdir()])
        finally:
            timer = threading.Timer(WARM_AFTER_S, self._warm)  # (the next one ready: its start costs most)
            timer.daemon = True
            timer.start()
        self._dirty = False

    def _warm(self) -> None:
        with self._guard:
            if self._clearer is None and self._lock_fd is not None:
                self._clearer = uid_leftovers.Clearer(self._keep())

    def _keep(self) -> tuple[int, ...]:
        return () if self._lock_fd is None else (self._lock_fd,)

    def _clear_later(self, identity: Optional[JobIdentity]) -> None:
        """``clear`` in a thread of its own: ``lend`` (``settle``) waits for it."""
        if identity is None:
            return
        self.settle()
        clearing = threading.Thread(target=self.clear, args=(identity,), name="baton-clear-job-user")
        try:
            clearing.start()
        except RuntimeError:  # (no thread to be had: cleared here instead)
            self.clear(identity)
            return
        self._clearing = clearing

    def settle(self) -> None:
        """Wait for the clear after the last attempt (``lent``), if it is under way: the uid's processes
        are then ended, and what they were lent may be removed."""
        if self._clearing is not None:
            self._clearing.join()
            self._clearing = None

    @contextlib.contextmanager
    def lent(self, gate: Any = None, read: Iterable[str] = ()) -> Iterator["Tenancy"]:
        """One attempt's identity (``lend``) for the ``with`` block, its store gate (a ``StoreGate``: its
        ``directory`` and its socket, ``address``) and the directories in ``read`` (its shipped code) lent to it;
        after the block (its processes ended), those taken back and the rest cleared (``clear``, beside what
        the worker does next: the next ``lend`` waits for it)."""
        tenancy = Tenancy(self.lend(), tuple(read))
        try:
            if gate is not None:
                grant(gate.directory, tenancy.identity, READ)
                grant(gate.address, tenancy.identity, SOCKET)
            for path in tenancy.read:
                grant(path, tenancy.identity, READ)
            yield tenancy
        finally:
            if tenancy.identity is not None:
                for path in tenancy.read:
                    with contextlib.suppress(OSError):
                        take_back(path)
            self._clear_later(tenancy.identity)


def _known(uid: int) -> bool:
    """Whether an account or a group of this machine has the number ``uid``."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except KeyError:
            pass
    return False


def _lock_dir() -> Path:
    """The first of ``LOCK_DIRS`` that is this user's alone (made if it is not there); ``JobUserError`` if none is."""
    for place in LOCK_DIRS:
        with contextlib.suppress(OSError):
            place.mkdir(mode=0o700)
        try:
            info = place.lstat()
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022:
            return place
    raise JobUserError(f"no directory for this worker's uid locks: {' and '.join(map(str, LOCK_DIRS))} are not "
                       "directories of this user's alone")


class Tenancy:
    """An attempt's identity while it holds it, and what it was lent."""

    def __init__(self, identity: Optional[JobIdentity], read: tuple[str, ...]):
        self.identity, self.read = identity, read

    def write(self, paths: Iterable[str]) -> None:
        """Lend the directories ``paths`` (its copies in memory) to write in."""
        for path in paths:
            grant(path, self.identity, WRITE)
