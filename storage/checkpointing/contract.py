"""What a checkpointer is to the training loop, and where its checkpoints go.

- ``CheckpointRequest``: what the loop asks to be checkpointed (its step, position, kind, the best
  value, the metrics rows);
- ``CheckpointTarget``: where one attempt's checkpoints go and what their commit must pass (the
  job's store and paths, the attempt, rotation, the fence, who hears of each commit);
- ``CheckpointStats``, ``CheckpointerTotals``: what each checkpoint cost the loop and the writer;
- ``Spacing``: the least time between two checkpoints that a periodic one keeps;
- ``Checkpointer``: the protocol every checkpointer implements for the loop: a single process's
  (``AsyncCheckpointer``), a data-parallel group's (every rank's state gathered to rank 0's) and a
  sharded job's (every rank writes its shard).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Optional, Protocol

from baton.schemas.manifest import CheckpointManifest
from baton.storage.layout import JobPaths
from baton.storage.stores.base import ObjectStore

UPLOAD_RETRY_S = 600.0
"""How long one checkpoint's upload and commit are retried through transient storage errors."""


@dataclass(frozen=True)
class CheckpointRequest:
    step: int
    epoch: int
    batch_in_epoch: int
    kind: str  # "step" | "epoch" | "stop"
    best: Optional[tuple[str, float]] = None  # (metric, value) when this checkpoint is the new best
    metrics_rows: Optional[list[dict]] = None  # every row so far: written with the checkpoint, referenced by its commit


@dataclass
class CheckpointStats:
    key: str
    kind: str
    stall_s: float
    write_s: float = 0.0
    bytes: int = 0


@dataclass
class CheckpointerTotals:
    taken: int = 0
    skipped: int = 0
    done: list[CheckpointStats] = field(default_factory=list)


@dataclass
class Spacing:
    """A periodic checkpoint is skipped within ``min_interval_s`` of the start of the last one taken (the
    loop spaces its validations' checkpoints likewise, but for a new best, a stop, a pause, the end). It bounds what a fast loop's checkpoints
    cost the control plane (each commit's fence reads Redis) and the store (each is a few PUTs) by time,
    not by the step rate; any checkpoint resumes bit-exactly, so which ones are skipped changes nothing else."""

    min_interval_s: float = 0.0
    _last: Optional[float] = None

    def too_soon(self) -> bool:
        return self._last is not None and time.monotonic() - self._last < self.min_interval_s

    def taken(self) -> None:
        self._last = time.monotonic()


def _no_fence() -> None:
    pass


def _ignore_commit(manifest: CheckpointManifest, stats: CheckpointStats) -> None:
    pass


@dataclass(frozen=True)
class CheckpointTarget:
    """Where one attempt's checkpoints go: under ``paths`` (the job's) in ``store``, as ``attempt``,
    the newest ``keep_last`` kept. ``fence`` runs just before each commit (FencedOut stops it),
    ``on_commit`` hears of each one; storage errors are retried for ``upload_retry_s``; periodic
    checkpoints are at least ``min_interval_s`` apart (``Spacing``)."""

    store: ObjectStore
    paths: JobPaths
    attempt: int
    keep_last: int
    fence: Callable[[], None] = _no_fence
    on_commit: Callable[[CheckpointManifest, CheckpointStats], None] = _ignore_commit
    upload_retry_s: float = UPLOAD_RETRY_S
    log: Callable[[str], None] = print
    min_interval_s: float = 0.0

    @property
    def attempt_paths(self) -> JobPaths:
        """The keys this attempt writes under (``attempt-<n>/``)."""
        return self.paths.for_attempt(self.attempt)


class Checkpointer(Protocol):
    """What the training loop asks of a checkpointer, on every rank."""

    totals: CheckpointerTotals

    @property
    def captures_weights(self) -> bool:
        """False where the checkpointer takes the model and the optimizer itself (as shards): the
        loop's capture then leaves them out."""

    def save(self, capture: Callable[[], dict[str, Any]], request: CheckpointRequest, mandatory: bool,
             stable: Optional[Collection[int]] = None) -> bool:
        """Snapshot what ``capture()`` returns and commit it in the background; False when skipped."""

    def before_optimizer_step(self) -> None:
        """Wait for a snapshot's copy still reading the parameters (the loop is about to change them)."""

    def poll(self) -> None:
        """Collect the checkpoint in flight if it has finished (raising its failure)."""

    def wait(self) -> None:
        """Block until the checkpoint in flight is committed (raising its failure)."""

    def checkpoint_key(self, step: int) -> str:
        """Where the checkpoint of ``step`` is written (the metrics rows name it)."""

    def close(self) -> None:
        """Finish the checkpoint in flight, then release what this checkpointer holds."""

    def abandon(self) -> None:
        """Stop after a failure elsewhere: nothing more is committed once this returns."""

    def describe(self) -> str:
        """What checkpointing cost here, for the job's log."""
