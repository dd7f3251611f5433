"""A multi-node job's attempt on each of its workers: the leader's part and a follower's (``gang.py``
forms the gang in Redis).

**The leader** (the worker that took the message of the job's next attempt) forms the gang,
publishes N-1 join messages to the job's queue and waits until the gang is admitted, renewing it
meanwhile. Only then does it claim the attempt and run it as any job, with a ``Leadership``: its rank
0 serves the rendezvous (a TCP store on a free port of ``node_address``) and publishes it, with the
attempt's secret and the ranks' arguments, in the gang's record. A gang that does not fill within
``gang_timeout_s`` is dissolved and its message passed on: no attempt is claimed. However the
attempt ends, the leader dissolves its gang, and every follower's ranks are killed.

**A follower** (a worker that took a join message) joins, keeps its place (a lease of its own) while
it waits, and once the rendezvous is published starts its node's ranks with their global numbers
(``Ranks``). A sharded checkpoint to resume from is downloaded to this node's scratch first, every
file verified. It then watches its ranks, the gang and its own lease:

- a rank that fails in the job's code: its report goes to the leader through the gang's record (the
  leader fails the job with that traceback); a rank that dies otherwise: a loss, likewise reported;
- the gang dissolved (the attempt ended, or the leader's node was lost: its ranks die with it, the
  others' collectives fail) or this worker's place lost: its ranks are killed;
- SIGTERM to this worker: passed to its ranks, which stop with every other rank at the same step
  after one checkpoint (the stop flag is agreed across the whole group at every step).
"""
from __future__ import annotations

import json
import logging
import shutil
import signal
import socket
import threading
import time
from typing import Callable, Optional

from baton.schemas.errors import TransientError
from baton.schemas.manifest import CheckpointEntry
from baton.schemas.spec import JobSpec
from baton.storage import owned_dirs
from baton.storage.artifacts import download_checkpoint
from baton.storage.checkpointer import SPOOL_PREFIX
from baton.storage.open import open_store
from baton.workers.parallel import failure_report
from baton.workers.parallel.errors import RankFailed, RankLost
from baton.workers.parallel.failure_report import EXIT_USER_CODE
from baton.workers.parallel.launcher import SETTLE_S, Ranks, describe_exit

from .gang import Gang, Gangs, Led, Membership

_log = logging.getLogger("baton.worker")

POLL_S = 0.1
"""How often a leader looks for its gang to fill, and a follower for its gang to start."""
WATCH_S = 0.2
"""How often a follower looks at its ranks (and, every few looks, at its gang)."""


def node_address(settings) -> str:
    """Where this worker is reached by other nodes: BATON_NODE_ADDRESS, else its host name resolved."""
    if settings.node_address:
        return settings.node_address
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()


class Leadership:
    """What a gang's leader gives its attempt: where to serve the rendezvous, how to publish it, and
    what the other nodes reported."""

    def __init__(self, gangs: Gangs, led: Led, address: str, lease_ttl_s: float):
        self.gangs, self.led, self.nodes, self.address = gangs, led, led.nodes, address
        self.loss_wait_s = lease_ttl_s + 1.0  # a dead follower's lease lapses within its TTL

    def start(self, endpoint: str, secret: str, args: dict) -> None:
        if not self.gangs.start(self.led, endpoint, secret, json.dumps(args)):
            raise RankLost(f"the gang of job {self.led.job_id} was dissolved before its ranks could start")

    def remote_failure(self) -> Optional[BaseException]:
        """A follower's report: the job's code failed on one of its ranks (RankFailed), or a rank or
        the node was lost (RankLost: reported, or its worker's lease in the gang lapsed); None before."""
        gang = self.gangs.read(self.led.job_id)
        if gang is None or gang.id != self.led.id:
            return None
        if gang.failure:
            report = json.loads(gang.failure)
            where = f"rank {report['rank']} of {report['world_size']}"
            return RankFailed(f"{where}: {report['exception']}", report["traceback"], origin=f"on {where}")
        if gang.lost:
            return RankLost(gang.lost)
        lapsed = self.gangs.lapsed_members(self.led.job_id, gang)
        if lapsed:
            return RankLost(f"node {lapsed[0]} ({gang.workers[lapsed[0]]}) was lost: its worker's lease in the gang "
                            "lapsed")
        return None


def lead(ctx, job_id: str, attempt: int, nodes: int, queue: str, pass_on: Callable[[str], str],
         run: Callable[[Leadership], str]) -> str:
    """The leader's part; ``pass_on(event)`` hands the message back unclaimed, ``run`` claims the
    attempt and trains it (``job_runner``)."""
    settings = ctx.settings
    gangs, address = Gangs(ctx.redis), node_address(settings)
    status, led = gangs.form(job_id, queue, attempt, nodes, ctx.worker, address, settings.lease_ttl_s)
    if status == "busy":
        return pass_on(f"waiting for nodes: the gang of {gangs.busy_with(queue) or 'another job'} is forming on "
                       f"queue {queue} first")
    if led is None:
        _log.info("job %s attempt %d: dropped (gang: %s)", job_id, attempt, status)
        return "dropped"
    for _ in range(nodes - 1):
        ctx.publish_join(job_id, attempt, nodes, queue)
    _log.info("job %s attempt %d: leading a gang of %d nodes; waiting for them to join", job_id, attempt, nodes)
    deadline = time.monotonic() + settings.gang_timeout_s
    while True:
        if not gangs.renew(led, settings.lease_ttl_s):
            return "dropped"
        state, joined = gangs.admit(led)
        if state == "admitted":
            break
        if state != "forming":  # the job no longer waits (cancelled)
            gangs.dissolve(led, "the job no longer waits for nodes")
            return "dropped"
        if time.monotonic() >= deadline or ctx.preemption.requested.is_set():
            why = (f"waiting for nodes: only {joined} of {nodes} joined in {settings.gang_timeout_s:.0f}s; offered again"
                   if not ctx.preemption.requested.is_set() else f"waiting for nodes: {ctx.worker} is shutting down")
            gangs.dissolve(led, why)
            return pass_on(why)
        time.sleep(POLL_S)
    _log.info("job %s attempt %d: gang of %d nodes admitted", job_id, attempt, nodes)
    keeper = _Renewer(lambda: gangs.renew(led, settings.lease_ttl_s), settings.heartbeat_s)
    keeper.start()
    outcome = "error"
    try:
        outcome = run(Leadership(gangs, led, address, settings.lease_ttl_s))
        return outcome
    finally:
        keeper.stop()
        gangs.dissolve(led, f"attempt {attempt} ended ({outcome})")


def follow(ctx, job_id: str, attempt: int, nodes: int) -> str:
    """A follower's part, for the join message of ``attempt``."""
    settings = ctx.settings
    gangs = Gangs(ctx.redis)
    membership, why = gangs.join(job_id, attempt, nodes, ctx.worker, node_address(settings), settings.gang_distinct,
                                 settings.lease_ttl_s)
    if membership is None:
        _log.info("job %s attempt %d: not joined (%s)", job_id, attempt, why)
        return "dropped"
    _log.info("job %s attempt %d: joined its gang as node %d", job_id, attempt, membership.node)
    keeper = _Renewer(lambda: gangs.renew_member(job_id, membership, settings.lease_ttl_s), settings.heartbeat_s)
    keeper.start()
    try:
        gang = _wait_for_start(gangs, job_id, membership, keeper, settings.gang_timeout_s + settings.lease_ttl_s)
        if gang is None:
            _log.info("job %s attempt %d: the gang did not start; left it", job_id, attempt)
            return "left"
        return _run_node(ctx, gangs, job_id, gang, membership, keeper)
    finally:
        keeper.stop()
        gangs.leave(job_id, membership)


def _wait_for_start(gangs: Gangs, job_id: str, membership: Membership, keeper: "_Renewer",
                    timeout_s: float) -> Optional[Gang]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not keeper.lost.is_set():
        gang = gangs.read(job_id)
        if gang is None or gang.id != membership.gang or gang.state == "dissolved":
            return None
        if gang.state == "running":
            return gang
        time.sleep(POLL_S)
    return None


def _run_node(ctx, gangs: Gangs, job_id: str, gang: Gang, membership: Membership, keeper: "_Renewer") -> str:
    args = json.loads(gang.args)
    spec = JobSpec.parse(args["spec"])
    per_node = spec.resources.processes
    first = membership.node * per_node
    args["allowed_prefixes"] = list(ctx.settings.allowed_prefixes)  # what this worker allows
    store = open_store(args["storage_url"])
    scratch = owned_dirs.make(SPOOL_PREFIX, store.scratch_dir())
    try:
        entry = args.pop("resume_entry", None)
        if entry is not None:  # sharded: this node's copy of the checkpoint the leader chose, every file verified
            try:
                args["resume_dir"] = str(download_checkpoint(store, CheckpointEntry(**entry), scratch / "resume"))
            except (TransientError, OSError, ValueError) as exc:
                return _report_lost(gangs, job_id, gang, f"node {membership.node} ({ctx.worker}) could not read the "
                                    f"checkpoint: {type(exc).__name__}: {exc}")
        ranks = Ranks(args["world_size"], args, lambda message: _log.info("job %s: %s", job_id, message),
                      on_hang=lambda why: None, ranks=range(first, first + per_node), endpoint=gang.endpoint,
                      secret=gang.secret)
        try:
            return _watch(ctx, gangs, job_id, gang, membership, keeper, ranks)
        finally:
            ranks.kill()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _watch(ctx, gangs: Gangs, job_id: str, gang: Gang, membership: Membership, keeper: "_Renewer",
           ranks: Ranks) -> str:
    forwarded = False
    looks = 0
    while True:
        codes = [proc.poll() for proc in ranks.procs]
        if all(code == 0 for code in codes):
            return "done"
        if any(code not in (None, 0) for code in codes):
            time.sleep(SETTLE_S)  # a rank whose collective broke under it may exit before the one that failed
            codes = [proc.poll() for proc in ranks.procs]
            ended = sorted(((rank, code) for rank, code in zip(ranks.ranks, codes) if code not in (None, 0)),
                           key=lambda ended_rank: ended_rank[1] != EXIT_USER_CODE)
            rank, code = ended[0]
            report = failure_report.read_earliest(ranks.directory)  # written before the rank left, however it left
            if report is not None:
                gangs.report(job_id, gang.id, "failure", json.dumps({
                    "rank": report.rank, "world_size": ranks.world_size, "exception": report.exception,
                    "traceback": report.traceback}))
                return "failed"
            return _report_lost(gangs, job_id, gang, f"{describe_exit(rank, code)} on node {membership.node} "
                                f"({ctx.worker})")
        if ctx.preemption.requested.is_set() and not forwarded:  # every rank stops at the same step, once
            for proc in ranks.procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            forwarded = True
        looks += 1
        if looks % 5 == 0:
            now = gangs.read(job_id)
            if now is None or now.id != gang.id or now.state != "running":
                _log.warning("job %s: its gang ended (%s); stopping node %d's ranks", job_id,
                             now.reason if now is not None else "gone", membership.node)
                return "dissolved"
            if keeper.lost.is_set():
                _log.warning("job %s: node %d lost its place in the gang; stopping its ranks", job_id, membership.node)
                return "lost"
        time.sleep(WATCH_S)


def _report_lost(gangs: Gangs, job_id: str, gang: Gang, what: str) -> str:
    _log.warning("job %s: %s", job_id, what)
    gangs.report(job_id, gang.id, "lost", what)
    return "lost"


class _Renewer(threading.Thread):
    """Calls ``renew`` every ``every_s`` until stopped; ``lost`` once a renewal says the place is gone."""

    def __init__(self, renew: Callable[[], bool], every_s: float):
        super().__init__(name="baton-gang-renewal", daemon=True)
        self._renew, self._every_s = renew, every_s
        self._stopping = threading.Event()
        self.lost = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(self._every_s):
            try:
                if not self._renew():
                    self.lost.set()
                    return
            except Exception as exc:  # noqa: BLE001 - Redis away: try again next period
                _log.warning("gang renewal failed (%s); trying again", exc)

    def stop(self) -> None:
        self._stopping.set()
