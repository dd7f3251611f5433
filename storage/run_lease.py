"""``baton run``'s hold on a job: a small lease object in the job's prefix (``run-lease.json``).

A worker's attempt is held by its lease in Redis; ``baton run`` has no Redis, so two runs of one id
would both train, each claiming the manifest and deleting the other's checkpoints in rotation. The
lease keeps that to one: it is taken with a conditional write (of two runs starting at once, one
wins) and renewed every ``RENEW_EVERY_S``; a second run refuses (``RunningElsewhere``) while the
holder is alive. The holder is gone when its process has exited (same machine: checked at once) or
its lease has not been renewed for ``LAPSES_AFTER_S`` (another machine, or a frozen process); the
next run then takes over. A holder that finds its lease taken stops as fenced out, and the manifest's
claim (the run's nonce) fences its commits in any case.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

from baton.schemas.errors import PreconditionFailed, RunningElsewhere, TransientError

from baton.storage.stores.base import ObjectStore
from baton.storage.layout import JobPaths
from baton.storage.processes import process_exists

RENEW_EVERY_S = 2.0
"""How often the holder rewrites its lease."""
LAPSES_AFTER_S = 20.0
"""A lease not renewed for this long is a holder gone (clocks of two machines may differ by seconds)."""


@dataclass(frozen=True)
class Holder:
    nonce: str
    host: str
    pid: int
    renewed_at: float  # the holder's wall clock

    def describe(self, now: float) -> str:
        return f"pid {self.pid} on {self.host}, lease renewed {max(0.0, now - self.renewed_at):.0f}s ago"

    def alive(self, now: float) -> bool:
        if now - self.renewed_at > LAPSES_AFTER_S:
            return False
        if self.host == socket.gethostname():
            return process_exists(self.pid)
        return True



def read_holder(store: ObjectStore, paths: JobPaths) -> Optional[tuple[Holder, str]]:
    """The job's current lease holder and the lease's version, or None."""
    found = store.read_versioned(paths.run_lease)
    if found is None:
        return None
    return Holder(**json.loads(found[0])), found[1]


def held(store: ObjectStore, paths: JobPaths) -> bool:
    """Whether a live ``baton run`` holds the job now."""
    found = read_holder(store, paths)
    return found is not None and found[0].alive(time.time())


class LocalLease:
    """Take with ``acquire()`` (RunningElsewhere if a live run holds the job), give back with ``release()``."""

    def __init__(self, store: ObjectStore, paths: JobPaths, log: Callable[[str], None] = print):
        self.store, self.paths, self.log = store, paths, log
        self.nonce = secrets.token_hex(8)
        self.lost = threading.Event()
        self._version: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _body(self) -> bytes:
        holder = Holder(self.nonce, socket.gethostname(), os.getpid(), time.time())
        return json.dumps(asdict(holder)).encode()

    def acquire(self) -> "LocalLease":
        found = read_holder(self.store, self.paths)
        if found is not None and found[0].alive(time.time()):
            raise self._elsewhere(found[0])
        try:
            self.store.put_if(self.paths.run_lease, self._body(), found[1] if found else None)
        except PreconditionFailed:  # another run took it between our read and our write
            now = read_holder(self.store, self.paths)
            raise self._elsewhere(now[0] if now else None) from None
        mine = read_holder(self.store, self.paths)
        if mine is None or mine[0].nonce != self.nonce:
            raise self._elsewhere(mine[0] if mine else None)
        self._version = mine[1]
        self._thread = threading.Thread(target=self._renew, name="baton-run-lease", daemon=True)
        self._thread.start()
        return self

    def _elsewhere(self, holder: Optional[Holder]) -> RunningElsewhere:
        who = holder.describe(time.time()) if holder else "another run took it at the same moment"
        return RunningElsewhere(f"job {self.paths.job_id} is running elsewhere: {who}; wait for it to end, or stop "
                                "it (a run killed outright is taken over at once on its machine, elsewhere after "
                                f"{LAPSES_AFTER_S:.0f}s)")

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_EVERY_S):
            try:
                self.store.put_if(self.paths.run_lease, self._body(), self._version)
                found = read_holder(self.store, self.paths)
                self._version = found[1] if found else self._version
            except PreconditionFailed:  # taken over: this run was thought gone (frozen past the lapse)
                self.lost.set()
                self.log(f"job {self.paths.job_id}: another run took the job over; this one stops")
                return
            except TransientError as exc:  # the store is away: the next renewal tries again
                self.log(f"job {self.paths.job_id}: the run lease was not renewed ({exc})")

    def release(self) -> None:
        """Stop renewing and remove the lease if it is still this run's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.lost.is_set():
            return
        try:
            found = read_holder(self.store, self.paths)
            if found is not None and found[0].nonce == self.nonce:
                self.store.delete(self.paths.run_lease)
        except TransientError as exc:  # it lapses by itself
            self.log(f"job {self.paths.job_id}: the run lease was left to lapse ({exc})")
