"""Sharded checkpoints (``resources.strategy: fsdp``): every rank writes its own shard, the holder commits.

The checkpointer as the loop sees it on every rank of a sharded job (the format: ``sharded_state``).
A checkpoint, on every rank:

1. **The stall.** A periodic checkpoint is skipped on every rank if any rank is still writing the
   previous one (one all-reduce: the ranks never disagree on what they save); a mandatory one
   waits for it. The model's buffers (not sharded) are made rank 0's, as DDP does, so that the one
   copy DCP keeps is every rank's. Then the host copy of this rank's shard of the model and
   optimizer state and of its own state (``HostSnapshot``: buffers reused from one checkpoint to
   the next, pinned on CUDA). The copy of the parameters' and the optimizer state's shards overlaps
   the next forward and backward (a CUDA side stream, or a thread on the CPU), and the loop waits
   for it, if at all, just before the next optimizer step. Host memory: about one rank's shard.
2. **In a background thread**: ``torch.distributed.checkpoint.save`` of the host copy into this
   rank's spool (DCP's planning exchanges the ranks' plans on a gloo group of its own, never the
   loop's), the rank's own file, then each file's sha256 and upload under the attempt's keys.
   Every rank's report (key, size, sha256 per file, or its error) is gathered to rank 0.
3. **The commit.** Rank 0 makes the one fenced manifest commit (``CommitWork.publish``) listing
   every rank's files, then tells every rank how it went: a checkpoint exists for readers only once
   every shard is durable, and no rank uploads its next shard while the holder's garbage collection
   may still run.

Rank 0's ``abandon`` (fenced out, a failure) stops the commit as the single-process checkpointer's
does; the other ranks are killed with the attempt.
"""
from __future__ import annotations

import shutil
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Collection, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from baton.schemas.errors import CheckpointCancelled, CheckpointWriteFailed, TransientError
from baton.schemas.manifest import CheckpointEntry, ObjectRef, sharded_digest
from baton.storage import failpoints, owned_dirs
from baton.storage.artifacts import file_sha256, object_name
from baton.storage.checkpoint_io import ROWS_KEY, RowLines, save_to_file
from baton.storage.checkpointing.checkpointer import SPOOL_PREFIX
from baton.storage.checkpointing.commit_work import CommitWork
from baton.storage.checkpointing.contract import (CheckpointerTotals, CheckpointRequest, CheckpointStats, CheckpointTarget,
                                                  Spacing)
from baton.storage.stores.retry import retry_transient
from baton.storage.checkpointing.plain import unwrap
from baton.storage.checkpointing.snapshot import HostSnapshot, storage_key
from baton.workers.training.batches import tensors
from baton.workers.training.components import Components

from baton.workers.parallel.sharded_state import own_state, rank_file, sharded_parts


class ShardedCheckpointer:
    """One per rank, each writing ``target``'s shards (the job's store and paths); rank 0 commits, with
    ``target``'s fence and ``on_commit`` (as ``AsyncCheckpointer``'s) and rotation."""

    def __init__(self, group, parts: Components, target: CheckpointTarget):
        self.group, self.parts, self.store = group, parts, target.store
        self.paths = target.attempt_paths
        self.fence, self.on_commit, self.log = target.fence, target.on_commit, target.log
        self.upload_retry_s = target.upload_retry_s
        self.totals = CheckpointerTotals()
        self._spacing = Spacing(target.min_interval_s)
        self._spool = owned_dirs.make(SPOOL_PREFIX, target.store.scratch_dir())
        on_cpu = parts.device.type == "cpu"  # on CUDA the shards' copy overlaps on a side stream instead
        self._snapshot = HostSnapshot(pin_memory=not on_cpu, overlap_on_cpu=on_cpu)
        self._inflight: Optional[tuple[Future, CheckpointStats]] = None
        self._cancelled = threading.Event()
        self._commit_lock = threading.Lock()
        self._rows = RowLines()
        self._work = CommitWork(target, self._spool, self._gate, self._cancelled.is_set) if group.rank == 0 else None
        self._taken: list[CheckpointStats] = []  # every checkpoint's stats (the latest's stall may still grow)

    captures_weights = False
    """The loop's capture leaves out the model and the optimizer: this takes them as shards."""

    # --- called by the training loop -------------------------------------------------------
    def save(self, capture: Callable[[], dict[str, Any]], request: CheckpointRequest, mandatory: bool,
             stable: Optional[Collection[int]] = None) -> bool:
        """Every rank calls this at the same step (see the module's docstring); False when skipped.
        ``stable`` is ignored: the shards' own storages are the stable ones here."""
        started = time.perf_counter()
        # at every due checkpoint, taken or skipped: the buffers' values must not depend on the timing of skips
        self.group.share_buffers(self.parts.model)
        busy = (self._inflight is not None and not self._inflight[0].done()
                or self._spacing.too_soon() and not failpoints.held())  # (as AsyncCheckpointer's)
        if not mandatory and self.group.any_rank(busy):  # (the ranks agree on each skip: every one has the same)
            self.totals.skipped += 1
            return False
        self._spacing.taken()
        self.wait()
        own = own_state(capture())
        own["config"] = {**own["config"], "processes": self.group.world_size, "strategy": "fsdp"}
        state = {**sharded_parts(self.parts), "own": own}
        snapshot = self._snapshot.take(state, self._stable_keys(state))
        stats = CheckpointStats(self.paths.checkpoint_dir(request.step), request.kind, time.perf_counter() - started)
        self._taken.append(stats)
        self.totals.taken += 1
        future: Future = Future()
        copies = self._snapshot.copies
        threading.Thread(target=self._write, args=(snapshot, copies, request, stats, future), daemon=True,
                         name="baton-sharded-checkpoint").start()
        self._inflight = (future, stats)
        return True

    def before_optimizer_step(self) -> None:
        """Wait for the shards' copy still running (the stall's second part, counted in its stats)."""
        waited = self._snapshot.wait_for_side_copies()
        if waited and self._taken:
            self._taken[-1].stall_s += waited

    def poll(self) -> None:
        if self._inflight is not None and self._inflight[0].done():
            self.wait()

    def wait(self) -> None:
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight[0].result()
            self.totals.done.append(inflight[1])

    def close(self) -> None:
        try:
            self.wait()
        finally:
            shutil.rmtree(self._spool, ignore_errors=True)

    def abandon(self) -> None:
        """As ``AsyncCheckpointer.abandon``: nothing is committed once this has returned."""
        self._cancelled.set()
        with self._commit_lock:
            pass
        inflight, self._inflight = self._inflight, None
        if inflight is None or inflight[0].done():
            shutil.rmtree(self._spool, ignore_errors=True)
        else:
            inflight[0].add_done_callback(lambda _: shutil.rmtree(self._spool, ignore_errors=True))

    def checkpoint_key(self, step: int) -> str:
        return self.paths.checkpoint_dir(step)

    def describe(self) -> str:
        """This rank's stall per checkpoint taken."""
        stalls = [stats.stall_s for stats in self._taken]
        mean_ms = 1000 * sum(stalls) / len(stalls) if stalls else 0.0
        return f"{len(stalls)} sharded checkpoints, mean stall {mean_ms:.2f} ms"

    # --- the background thread ---------------------------------------------------------------
    def _write(self, snapshot: dict, copies, request: CheckpointRequest, stats: CheckpointStats, future: Future) -> None:
        started = time.perf_counter()
        report: dict[str, Any]
        try:
            try:
                copies.wait_all()
            except BaseException:  # still take part in DCP's collectives (with nothing), or the others would hang
                self._save_shards({}, request)
                raise
            report = {"files": self._write_own(snapshot, request)}
        except BaseException as exc:  # every rank still reports, so that none waits for it forever
            report = {"error": f"{type(exc).__name__}: {exc}"}
            own_error: Optional[BaseException] = exc
        else:
            own_error = None
        del snapshot
        try:
            reports = self.group.gather_to_first(report, group=self.group.checkpoint_group)
            if self.group.rank == 0:
                self._commit(reports, request, stats, started, future, own_error)
            else:
                outcome = torch.zeros(1, dtype=torch.int32)
                dist.broadcast(outcome, src=0, group=self.group.checkpoint_group)
                future.set_result(None)  # rank 0 fails the attempt if the commit failed
        except BaseException as exc:  # the group broke under it (a rank lost): the loop's collectives fail too
            if not future.done():
                future.set_exception(exc)

    def _write_own(self, snapshot: dict, request: CheckpointRequest) -> list[dict]:
        """DCP's save of the shards (a collective), this rank's own file, each file uploaded; the refs."""
        rank = self.group.rank
        directory = self._save_shards({"model": snapshot["model"], "optimizer": snapshot["optimizer"]}, request)
        own = unwrap(snapshot["own"])
        if isinstance(own.get(ROWS_KEY), list):
            own[ROWS_KEY] = self._rows.encode(own[ROWS_KEY])
        save_to_file(own, directory / rank_file(rank))
        mine = [path for path in sorted(directory.iterdir())
                if path.name.startswith(f"__{rank}_") or path.name == rank_file(rank)
                or (rank == 0 and path.name == ".metadata")]
        try:
            return [self._upload(path, f"{self.paths.checkpoint_dir(request.step)}/{object_name(path.name)}")
                    for path in mine]
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def _save_shards(self, state: dict, request: CheckpointRequest) -> Path:
        """DCP's save of ``state`` into this rank's spool: a collective over the checkpoint group."""
        directory = self._spool / f"step-{request.step}"
        writer = dcp.FileSystemWriter(str(directory), single_file_per_rank=True, sync_files=False, thread_count=1,
                                      overwrite=True)
        dcp.save(state, storage_writer=writer, process_group=self.group.checkpoint_group)
        return directory

    def _upload(self, path: Path, key: str) -> dict:
        size, sha256 = path.stat().st_size, file_sha256(path)

        def put() -> None:
            if self._cancelled.is_set():
                raise CheckpointCancelled("the checkpoint was cancelled: its attempt is over")
            self.store.put_file(key, path, consume=True)  # a rename on a file:// store: no copy
            stored = self.store.size(key)
            if stored != size:
                raise TransientError(f"{key}: stored {stored} bytes, wrote {size}")

        try:
            retry_transient(put, self.upload_retry_s, f"upload {key}", self.log)
        except OSError as exc:
            raise CheckpointWriteFailed(f"could not upload {key}: {type(exc).__name__}: {exc}") from exc
        return {"key": key, "size": size, "sha256": sha256}

    def _commit(self, reports: list, request: CheckpointRequest, stats: CheckpointStats, started: float,
                future: Future, own_error: Optional[BaseException]) -> None:
        """Rank 0: commit once every rank's files are up, then tell the ranks (1: committed, 0: not)."""
        failure: Optional[BaseException] = own_error
        manifest = None
        if failure is None:
            errors = [f"rank {rank}: {r['error']}" for rank, r in enumerate(reports) if "error" in r]
            if errors:
                failure = CheckpointWriteFailed(f"sharded checkpoint at step {request.step}: {'; '.join(errors)}")
        work = self._work
        assert work is not None  # (rank 0's)
        if failure is None:
            try:
                files = [ObjectRef(**ref) for r in reports for ref in r["files"]]
                entry = CheckpointEntry(
                    key=self.paths.checkpoint_dir(request.step), files=files, size=sum(f.size for f in files),
                    sha256=sharded_digest(files), step=request.step, epoch=request.epoch,
                    batch_in_epoch=request.batch_in_epoch, kind=request.kind, attempt=work.attempt,
                    created_at=time.time())
                manifest = work.publish(entry, request)
            except BaseException as exc:
                failure = exc
        outcome = torch.tensor([0 if failure is not None else 1], dtype=torch.int32)
        try:
            dist.broadcast(outcome, src=0, group=self.group.checkpoint_group)
        finally:
            if failure is not None or manifest is None:
                future.set_exception(failure or CheckpointWriteFailed(f"sharded checkpoint at step {request.step}: "
                                                                      "not committed"))
            else:
                stats.write_s = time.perf_counter() - started
                stats.bytes = sum(int(ref["size"]) for r in reports for ref in r["files"])
                try:
                    self.on_commit(manifest, stats)
                except BaseException as exc:  # as AsyncCheckpointer's: the loop sees it at its next wait
                    future.set_exception(exc)
                else:
                    future.set_result(None)

    def _gate(self, swap: Callable[[], Any]) -> Any:
        assert self._work is not None  # (rank 0's)
        with self._commit_lock:
            self._work.check_cancelled()
            self.fence()
            return swap()

    def _stable_keys(self, state: dict) -> set[int]:
        """Storage keys of the shards of the parameters and the optimizer state (only the optimizer's
        step modifies them): their device-to-host copy may overlap the next forward and backward."""
        keys: set[int] = set()
        for part in ("model", "optimizer"):
            keys.update(storage_key(tensor) for tensor in tensors(state[part]))
        buffers = {storage_key(b) for b in self.parts.model.buffers()}  # a forward may write these
        return keys - buffers

