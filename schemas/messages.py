"""What crosses a process boundary while a job runs, typed (each validated where it arrives):

- ``AttemptOrder``: a worker to the training process it forks for an attempt (which job, which
  attempt, the claim holding it, what its code may import, where its copies in memory live, and, for
  a multi-node job's leader, how its rank 0 reaches the other nodes: ``PeersOrder``);
- ``AttemptEnd``: that training process back to its worker, once: the loop's ``Outcome``, or the
  ``Failure`` that ended the attempt, classified where the exception was (``Ending``);
- ``GroupOrder``: what every rank of an attempt's group starts from (the spec, the checkpoint to
  resume from, threads, device); rank 0 gives it to the ranks it starts, and a multi-node leader
  publishes it for the other nodes; ``RankOrder`` adds one rank's place to it.
"""
from __future__ import annotations

from enum import Enum
from typing import Optional

from pydantic import BaseModel, ConfigDict

from baton.schemas.manifest import CheckpointEntry
from baton.schemas.spec import JobSpec


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Ending(str, Enum):
    """How an attempt ended, as its worker acts on it (``baton.workers.queue.endings`` holds the table)."""

    SUCCEEDED = "succeeded"
    CANCELLED = "cancelled"  # at a step boundary, after a checkpoint
    STOPPED = "stopped"  # preempted or interrupted, after a checkpoint: released for another worker, uncounted
    FAILED = "failed"  # the job's own code or spec: recorded, never retried
    FENCED = "fenced"  # another attempt owns the job: nothing more is written
    STORAGE = "transient"  # the store stayed unreachable: released, uncounted
    NODE_RELEASED = "node_released"  # another node of the job is shutting down: released, uncounted
    RANK_LOST = "rank_lost"  # a rank died: a worker loss, counted
    CHECKPOINT_WRITE = "checkpoint_write"  # this machine's disk or memory: a worker loss, counted
    CRASHED = "crashed"  # the training process died without saying how: a worker loss, counted
    STALLED = "stalled"  # no optimizer step for the stall timeout: a worker loss, counted
    PAUSED = "paused"  # at the validation that reached its pause_at, after its checkpoint: kept, not queued
    CODE = "code"  # the job's shipped code was refused here (digest, contents) or its package index unreachable: a loss


class Outcome(Message):
    """How the loop ended: ``completed``, or stopped early (``reason``) at the checkpoint of ``step``."""

    completed: bool
    reason: Optional[str] = None
    step: Optional[int] = None


class Failure(Message):
    """What ended an attempt before its loop did: ``ending`` says whose fault it was."""

    ending: Ending
    message: str
    type: str
    summary: Optional[str] = None  # the job's failure in one line (FAILED only)
    traceback: Optional[str] = None  # FAILED only
    shown: Optional[str] = None  # FAILED only: the cause, then only the user's own frames (for a terminal)
    step: Optional[int] = None  # the last optimizer step completed


class AttemptEnd(Message):
    """The training process's last message: exactly one of ``outcome`` and ``failure``."""

    outcome: Optional[Outcome] = None
    failure: Optional[Failure] = None
    resumed_from_step: Optional[int] = None


class PeersOrder(Message):
    """A multi-node attempt's leader: its rank 0 serves the rendezvous at ``address`` for ``nodes``
    nodes, and waits up to ``loss_wait_s`` for another node's report when a collective breaks."""

    nodes: int
    address: str
    loss_wait_s: float


class JobIdentity(Message):
    """The user a job's processes run as on this node (``baton.workers.parallel.job_identity``)."""

    uid: int
    gid: int
    name: str  # USER and LOGNAME (a slot's uid has no account: ``baton-job-<uid>``)
    home: str  # its HOME and temporary directory, its own, removed after the attempt


class AttemptOrder(Message):
    spec: JobSpec
    job_id: str
    attempt: int
    storage_url: str
    claim: str
    allowed_prefixes: tuple[str, ...]
    worker: str
    memory: Optional[tuple[str, ...]] = None  # the directories of this job's copies in memory (one process)
    store_gate: Optional[str] = None  # what its processes open the store with: the worker's gate (workers/queue/store_gate.py)
    peers: Optional[PeersOrder] = None
    import_path: tuple[str, ...] = ()  # the job's shipped code and packages on this worker, imported first
    setup_log: tuple[str, ...] = ()  # what the worker did to have them (lines for the job's log)
    pause_at: Optional[int] = None  # the loop pauses at the validation that reaches it (epochs, or steps)
    identity: Optional[JobIdentity] = None  # the user its processes run as (None: the worker's own)


class GroupOrder(Message):
    spec: JobSpec
    job_id: str
    attempt: int
    storage_url: str
    world_size: int
    cpu_threads: int
    device_type: str
    allowed_prefixes: tuple[str, ...]
    import_path: tuple[str, ...] = ()  # this node's copies of the job's shipped code, imported first
    resume_key: Optional[str] = None  # the checkpoint each rank reads and verifies itself
    resume_sha256: Optional[str] = None
    resume_dir: Optional[str] = None  # sharded: the directory this node downloaded and verified it to
    resume_entry: Optional[CheckpointEntry] = None  # sharded, for the other nodes: each downloads it
    pause_at: Optional[int] = None  # every rank's loop pauses at the same validation
    identity: Optional[JobIdentity] = None  # the user this node's ranks run as (each node sets its own)


class RankOrder(Message):
    group: GroupOrder
    rank: int
    parent_pid: int  # the process that started it (it dies with it)
    directory: str  # the attempt's private directory on this node (its rendezvous, failure reports)
    endpoint: Optional[str] = None  # a multi-node attempt's rendezvous (a TCP store), else a file store in ``directory``
    store: Optional[str] = None  # what it opens the job's store with (its node's store gate), else group.storage_url
