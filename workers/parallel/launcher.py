"""Starting, watching and ending the ranks 1..N-1 of a data-parallel attempt (rank 0 is this process).

Each rank is a spare forked ahead of the attempt (``spare_ranks``: its place and the attempt's secret sent
through its pipe), on a multi-node follower a child of its worker's forkserver (``forked_ranks``), or, where
neither is at hand, ``python -m baton.workers.parallel.rank_main`` with its place in ``BATON_RANK_ARGS`` and
the secret in ``BATON_RANK_SECRET``. Rank 0 opens the rendezvous (``rendezvous``:
a file store in the attempt's private directory, no port) before starting them. No rank outlives its attempt:
- a rank asks the kernel for SIGKILL when rank 0 dies (``PR_SET_PDEATHSIG``, set by the rank
  itself at start, then it checks that its parent is still the one that started it): a SIGKILLed
  training process leaves no rank behind (nor does its worker: the training process ends with it);
  a follower's rank, whose parent is its worker's forkserver, is SIGKILLed by the kernel when its
  worker's end of its pipe closes (``forked_ranks``);
- rank 0 kills the ranks by PID whenever the attempt ends other than by finishing (fenced out,
  an exception, a stop), and waits for them;
- a watchdog thread notices a rank that exits early; if rank 0 is then still not out of the
  attempt after ``RANK_LOSS_GRACE_S`` (stuck in a collective that neither fails nor times out),
  it kills the ranks and ends this process (exit 70), so a worker never hangs holding a job: its
  lease expires and the job is re-queued as a worker loss.

Each attempt has a private directory (mode 0700, removed when its ranks are gone): the rendezvous,
and where a rank whose code raises leaves its report (``failure_report``): rank 0 then fails the job
with that rank's exception and traceback; a rank that dies without one is lost.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch.distributed as dist

from baton.schemas.errors import FencedOut, PermanentError, exception_chain
from baton.schemas.hosting import devices_missing
from baton.schemas.messages import GroupOrder, RankOrder
from baton.storage import owned_dirs
from baton.workers.parallel.job_identity import grant

from baton.storage.forked import ForkedChild
from baton.workers.parallel import failure_report, gpu_probe, rendezvous, spare_ranks
from baton.workers.parallel.errors import RankFailed, RankLost
from baton.workers.parallel.failure_report import EXIT_USER_CODE

_log = logging.getLogger("baton.worker")

ARGS_ENV = "BATON_RANK_ARGS"
RANKS_PREFIX = owned_dirs.RANKS_PREFIX
"""The attempt's private directory (``owned_dirs``: one left by a rank 0 killed outright is swept at the
next start of a worker or a run on the machine)."""
EXIT_HUNG = 70
RANK_LOSS_GRACE_S = 30.0
"""How long rank 0 may take to leave the attempt after another rank died, before the watchdog ends it."""
RENDEZVOUS_TIMEOUT_S = float(os.environ.get("BATON_RENDEZVOUS_TIMEOUT_S", "300"))
"""How long ranks 1..N-1 may take to start, read the checkpoint and reach the group."""
FINISH_WAIT_S = 60.0
"""How long a finished attempt waits for the other ranks to exit on their own."""
SETTLE_S = 0.5
"""How long rank 0 waits, after a rank reported a failure of the job's code, for another rank's loss
that may have caused it (a rank whose collective broke under it can raise from the job's code)."""


def _nothing_reported() -> Optional[BaseException]:
    return None


@dataclass(frozen=True)
class Meeting:
    """Where an attempt's ranks meet and how they prove they belong: its ``secret``; ``store``, on rank
    0's node, the store it watches for the ranks' ready marks; ``endpoint``, a multi-node attempt's TCP
    store (None: a file store in the ranks' private directory); ``remote``, what another node reported
    of its ranks (RankFailed, RankLost; None before), waited for up to ``remote_wait_s`` when a
    collective breaks."""

    secret: str
    store: Optional["dist.Store"] = None
    endpoint: Optional[str] = None
    remote: Callable[[], Optional[BaseException]] = _nothing_reported
    remote_wait_s: float = 5.0


class Ranks:
    """The ranks an attempt starts on this node (never this process's rank 0), watched until they end."""

    def __init__(self, order: GroupOrder, ranks: range, meeting: Meeting, log: Callable[[str], None],
                 directory: Optional[Path] = None, on_hang: Optional[Callable[[str], None]] = None,
                 start: Optional[Callable[[RankOrder, str], Any]] = None, store_url: Optional[str] = None):
        """Start ``ranks`` with ``order`` (each gets its place: ``RankOrder``), meeting as ``meeting`` says,
        their reports in ``directory`` (the attempt's private one on this node; made if None). Each rank
        is a spare where one is left, else ``start(place, secret)``'s process (a new interpreter if None, or where
        ``start`` cannot start one). ``store_url``: what the ranks open the job's store with (this node's
        store gate; None: the store's own URL)."""
        self.world_size, self.log = order.world_size, log
        self.ranks = ranks
        self.directory = directory or owned_dirs.make(RANKS_PREFIX)  # 0700: this user's processes only
        if directory is None:  # (a follower's worker made it: lent to the ranks' user, if they have their own)
            grant(self.directory, order.identity)
        self.secret = meeting.secret
        self.store = meeting.store
        self.procs: list["subprocess.Popen | ForkedChild"] = []
        self._ending = threading.Event()
        self._lost: Optional[str] = None
        self._on_hang = on_hang or _exit_hung
        self._remote = meeting.remote
        self.remote_wait_s = meeting.remote_wait_s
        try:
            for rank in self.ranks:
                place = RankOrder(group=order, rank=rank, parent_pid=os.getpid(), directory=str(self.directory),
                                  endpoint=meeting.endpoint, store=store_url)
                self.procs.append(self._start(place, start))
        except BaseException:  # none of them is left running, and their directory goes with them
            self.kill()
            raise
        if self.procs:
            self.log(f"data-parallel: {self.world_size} ranks; ranks {self.ranks[0]}..{self.ranks[-1]} are pids "
                     f"{', '.join(str(p.pid) for p in self.procs)}")
        self._watchdog = threading.Thread(target=self._watch, name="baton-rank-watchdog", daemon=True)
        self._watchdog.start()

    def _start(self, place: RankOrder, start: Optional[Callable[[RankOrder, str], Any]]) -> Any:
        proc = spare_ranks.start(place.model_dump(mode="json"), self.secret)
        if proc is None and start is not None:
            try:
                proc = start(place, self.secret)
            except (OSError, EOFError) as exc:  # (no descriptor or memory left, the forkserver died meanwhile)
                self.log(f"data-parallel: rank {place.rank} could not be forked here ({exc!r}); it starts as a "
                         "new interpreter")
        return proc or self._new(place, self.secret)

    @staticmethod
    def _new(place: RankOrder, secret: str) -> subprocess.Popen:
        """A rank as a new interpreter (no spare is left here: ``spare_ranks``). Never from a worker whose
        jobs run as a user of their own (a follower node's, whose forkserver failed it): the interpreter
        would be the worker's, with its credentials; the rank is lost instead (``OSError``)."""
        identity = place.group.identity
        if identity is not None and os.geteuid() != identity.uid:
            raise OSError(f"rank {place.rank} could not be forked as the job's user, and a new interpreter here "
                          "would run as this worker's")
        env = {**os.environ, ARGS_ENV: place.model_dump_json(), rendezvous.SECRET_ENV: secret}
        return subprocess.Popen([sys.executable, "-m", "baton.workers.parallel.rank_main"], env=env)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _watch(self) -> None:
        looks = 0
        while not self._ending.wait(0.2):
            looks += 1
            for rank, proc in zip(self.ranks, self.procs):
                code = proc.poll()
                if code is not None and code != 0 and self._lost is None:
                    self._lost = describe_exit(rank, code)
            if self._lost is None and looks % 10 == 0:  # another node's ranks: as its worker reports them
                reported = self._remote()
                if reported is not None:
                    self._lost = f"{type(reported).__name__}: {reported}"
            if self._lost is not None:
                self.log(f"data-parallel: {self._lost}; stopping the group")
                if self._ending.wait(RANK_LOSS_GRACE_S):
                    return
                self.kill()
                self._on_hang(f"{self._lost}, and rank 0 did not leave its collective in {RANK_LOSS_GRACE_S:.0f}s")
                return

    def wait_until_ready(self, timeout_s: float = RENDEZVOUS_TIMEOUT_S, poll_s: float = 0.05) -> None:
        """Wait until ranks 1..N-1 have reached the rendezvous (each says so in the store just before
        it joins the group), watching them meanwhile: a rank that exits first is RankFailed (the
        job's code or spec failed there: its report says how) or RankLost at once, one that has not
        come in ``timeout_s`` RankLost. Rank 0 joins the group only then: joining waits for every rank, and cannot tell a
        dead one from a slow one."""
        keys = [ready_key(rank) for rank in range(1, self.world_size)]
        deadline = time.monotonic() + timeout_s
        store = self.store
        assert store is not None  # rank 0's node opened it
        while not store.check(keys):
            reported = self._remote()  # another node could not start its ranks, or was lost
            if reported is not None:
                raise reported
            for rank, proc in zip(self.ranks, self.procs):
                code = proc.poll()
                if code == EXIT_USER_CODE:
                    raise self._failure(rank)
                if code is not None:
                    raise RankLost(f"{describe_exit(rank, code)} before it joined the group")
            if time.monotonic() >= deadline:  # this node's ranks; another node's report for itself (``remote``)
                missing = [rank for rank in self.ranks if not store.check([ready_key(rank)])]
                if missing:
                    raise RankLost(f"rank(s) {', '.join(map(str, missing))} did not reach the group within "
                                   f"{timeout_s:.0f}s (BATON_RENDEZVOUS_TIMEOUT_S)")
            time.sleep(poll_s)

    def explain(self, exc: BaseException) -> BaseException:
        """What rank 0's failure means: another rank's loss (RankLost), a failure of the job's code
        there (RankFailed, from the rank's report), or rank 0's own error (``exc`` itself). Another
        rank's end explains any error (a broken collective may surface inside the task's forward,
        wrapped as a TaskError). A loss outranks a reported failure: a rank whose collective broke
        because another rank died may raise from inside the job's code, and report that."""
        if isinstance(exc, (FencedOut, KeyboardInterrupt, SystemExit)):
            return exc
        collective = any(is_collective_error(e) for e in exception_chain(exc, follow_suppressed=True))
        # a dead rank's sockets close before it is reaped; another node's report comes through Redis
        deadline = time.monotonic() + (self.remote_wait_s if collective else 2.0)
        failed_at = None
        while True:
            reported = self._remote()  # another node's ranks: what its worker reported
            if reported is not None:
                return reported
            exits = [(rank, proc.poll()) for rank, proc in zip(self.ranks, self.procs)]
            lost = sorted(((rank, code) for rank, code in exits if code not in (None, 0, EXIT_USER_CODE)),
                          key=lambda lost_rank: lost_rank[1] >= 0)  # a rank killed by a signal first: the likelier cause
            if lost:
                return RankLost(describe_exit(*lost[0]))
            failed = [rank for rank, code in exits if code == EXIT_USER_CODE]
            if failed or failure_report.read_earliest(self.directory) is not None:
                failed_at = failed_at or time.monotonic()
                if time.monotonic() - failed_at >= SETTLE_S:
                    return self._failure(failed[0] if failed else None)
            elif time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if collective:
            first = str(exc).splitlines()[0] if str(exc) else ""
            return RankLost(f"a collective failed ({type(exc).__name__}: {first}); another rank stopped answering")
        return exc

    def _failure(self, rank: Optional[int]) -> RankFailed:
        """The job's code failed on a rank: the first failure any rank reported, with its traceback
        (``rank`` exited saying it failed, in case no report can be read)."""
        report = failure_report.read_earliest(self.directory)
        if report is None:
            return RankFailed(f"rank {rank} of {self.world_size}: the job's code failed there (its traceback is in "
                              "the job's log)")
        where = f"rank {report.rank} of {self.world_size}"
        return RankFailed(f"{where}: {report.exception}", report.traceback, origin=f"on {where}")

    def finish(self) -> None:
        """The attempt ended normally: the ranks leave on their own (killed after FINISH_WAIT_S)."""
        self._ending.set()
        deadline = time.monotonic() + FINISH_WAIT_S
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self) -> None:
        """SIGKILL every rank still running, by PID, and reap it."""
        self._ending.set()
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.kill()
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            proc.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def ready_key(rank: int) -> str:
    """The store key a rank sets just before it joins the group."""
    return f"baton/ready/{rank}"


def describe_exit(rank: int, code: int) -> str:
    if code == EXIT_USER_CODE:
        return f"rank {rank} stopped: the job's code failed there"
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
    return f"rank {rank} {how}"


def is_collective_error(exc: BaseException) -> bool:
    """torch.distributed's errors; and gloo's transport errors, which reach Python as plain RuntimeErrors
    ("[.../gloo/transport/tcp/pair.cc] Connection closed by peer": a peer's process died)."""
    return isinstance(exc, dist.DistError) or (isinstance(exc, RuntimeError) and "gloo/transport" in str(exc))



def _exit_hung(why: str) -> None:
    _log.error("data-parallel attempt stuck: %s; exiting", why)
    logging.shutdown()
    os._exit(EXIT_HUNG)


def check_devices(device_type: str, processes: int) -> None:
    """A CUDA job of N ranks needs N GPUs visible to this worker (``--gpus-per-job``). Workers pass
    such a job on before claiming it (``baton.workers.queue.delivery``); this refuses what reaches a claim anyway."""
    if device_type != "cuda":
        return
    missing = devices_missing("cuda", processes, gpu_probe.seen_by_torch())  # torch itself: it trains here
    if missing:
        raise PermanentError(missing)


def die_with_parent(parent_pid: int) -> None:
    """In a rank: SIGKILL this process when its parent (rank 0) dies, even by SIGKILL (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # rank 0 died before the request took effect
        os._exit(1)
