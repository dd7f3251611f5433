"""Copying a training state to host memory, into buffers reused from one checkpoint to the next.

This copy is the only part of a checkpoint the training loop waits for. On CUDA the buffers are
pinned and the copies non-blocking. Two ways to take it:

- ``take(state)``: the copies are complete when it returns (the current stream is synchronised),
  so the caller may read the buffers and modify the live tensors at once.
- ``take(state, stable=...)`` (CheckFreq-style pipelining): tensors whose storage is in
  ``stable`` (the parameters and the optimizer state: nothing but ``optimizer.step`` modifies
  them) are copied on a side stream, which first waits for the work already queued, and the call
  returns without waiting: the copy overlaps the next forward and backward. Every other CUDA
  tensor (buffers such as BatchNorm's running statistics, which a forward updates) is copied on
  the current stream, so the kernels queued after it see it done before they write. The loop must
  call ``wait_for_side_copies()`` before it modifies a stable tensor (before ``optimizer.step``),
  and whoever reads the buffers must call ``copies.wait_all()`` first (the background thread does).

On the CPU both are plain synchronous copies; on busy cores they use one intra-op thread
(``copy_threads``). A DTensor (a sharded job's parameter or optimizer state) is copied as its local
shard and comes back as a DTensor of the same layout over that host copy, which is what
torch.distributed.checkpoint writes.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Collection, Iterator, Optional

import torch

from baton.storage.checkpointing.plain import Plain, only_scalars

if TYPE_CHECKING:
    from baton.storage.checkpointing.shared_buffers import SharedBuffers



def _dtensor() -> Any:
    """DTensor (a sharded job's parameters and optimizer state, FSDP2: only the rank's own shard is copied),
    where something has imported it: no tensor can be one before. (Importing it costs a worker ~0.4 s of a
    core, sympy and dynamo included, which a job that shards nothing never needs.)"""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)

BUSY_COPY_THREADS = 1
"""torch intra-op threads for the snapshot's host copies when the cores are busy (the training's
count is restored after). A thread team is as fast as its slowest member, and on busy cores one
is often descheduled. Measured on 2 cores, 301 MB into reused buffers: at load 10, 72-119 ms with
1 thread against 191-270 ms with 2; on a quiet machine 2 threads take ~26 ms and 1 thread ~50."""


def copy_threads() -> int:
    """One thread when runnable tasks (the 1-minute load average) outnumber the cores by a whole
    task or more, else the training's own count. The load counts the training's own threads: a
    job using every core of an otherwise idle machine keeps a load near the core count, and must
    not be taken for a busy machine."""
    return BUSY_COPY_THREADS if machine_busy() else torch.get_num_threads()


def machine_busy(load: Optional[float] = None, cores: Optional[int] = None) -> bool:
    try:
        load = os.getloadavg()[0] if load is None else load
    except OSError:  # no load average on this platform
        return False
    return load >= (cores or os.cpu_count() or 1) + 1


@contextmanager
def _intra_op_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    if before <= n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class Copies:
    """The CUDA events after a snapshot's copies (None: nothing of that kind is pending)."""

    side: Optional[Any] = None  # torch.cuda.Event after the side stream's copies
    main: Optional[Any] = None  # torch.cuda.Event after the current stream's copies

    def wait_all(self) -> None:
        """Block until every copy has landed in the host buffers (any thread may call it)."""
        for event in (self.side, self.main):
            if event is not None:
                event.synchronize()


def storage_key(tensor: torch.Tensor) -> int:
    """What ``stable`` holds for a tensor: its storage's address (views and state_dict aliases of a
    parameter share it); a DTensor's is its local shard's (a DTensor has no storage of its own)."""
    dtensor = _dtensor()
    if dtensor is not None and isinstance(tensor, dtensor):
        tensor = tensor.to_local()
    return tensor.untyped_storage().data_ptr()


class ThreadCopies:
    """CPU copies running in a thread of their own, with a CUDA event's ``query``/``synchronize``."""

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]):
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._copy, args=(pairs,), name="baton-snapshot-copy", daemon=True)
        self._thread.start()

    def _copy(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        try:
            for buf, source in pairs:
                buf.copy_(source)  # torch releases the GIL while it copies
        except BaseException as exc:  # raised where the copies are awaited
            self._error = exc

    def query(self) -> bool:
        return not self._thread.is_alive()

    def synchronize(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


class HostSnapshot:
    """``shared``: allocate the buffers there (files another process maps: shared_buffers.py);
    None: private host memory, pinned when ``pin_memory`` and CUDA is available.
    ``overlap_on_cpu``: with ``stable``, CPU tensors in it are copied by a thread (``ThreadCopies``)
    while the loop goes on, as CUDA ones are on a side stream (a sharded job's checkpointer)."""

    def __init__(self, pin_memory: bool = False, shared: Optional["SharedBuffers"] = None,
                 overlap_on_cpu: bool = False):
        self.pin_memory = pin_memory and torch.cuda.is_available() and shared is None
        self.overlap_on_cpu = overlap_on_cpu
        self._deferred: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._cpu_stable: Collection[int] = ()
        self.shared = shared
        self._buffers: dict[str, torch.Tensor] = {}
        self._copied_from_cuda = False
        self._stable: Collection[int] = ()
        self._side_stream: Optional[Any] = None  # created on first use (CUDA only)
        self._side_used = False
        self._side_pending: Optional[Any] = None  # the event the loop has not waited for yet
        self.copies = Copies()  # those of the last take

    def take(self, state: Any, stable: Optional[Collection[int]] = None) -> Any:
        """A copy of ``state`` whose tensors live in this snapshot's host buffers.

        The buffers are overwritten by the next ``take``: the caller must be done with the
        previous copy (serialized it) before taking another. With ``stable`` (storage keys, see
        the module's docstring) the CUDA copies may still be running when it returns.
        """
        self.wait_for_side_copies()  # a previous snapshot's side copies, before their buffers are reused
        overlap = stable is not None and self.pin_memory
        self._stable = stable if stable is not None and overlap else ()
        self._copied_from_cuda = False
        self._side_used = False
        if overlap:
            current = torch.cuda.current_stream()
            if self._side_stream is None:
                self._side_stream = torch.cuda.Stream()
            side = self._side_stream
            side.wait_stream(current)  # copy the values after everything queued so far
        self._cpu_stable = stable if stable is not None and self.overlap_on_cpu else ()
        self._deferred = []
        with _intra_op_threads(copy_threads()):
            copy = self._walk(state, "")
        self.copies = Copies()
        if self._deferred:
            if self._copied_from_cuda:  # one pending copy is waited for: the side stream's or the thread's
                raise ValueError("overlap_on_cpu takes a state on the CPU (a CUDA state overlaps on a side stream)")
            self.copies.side = self._side_pending = ThreadCopies(self._deferred)
            self._deferred = []
        if self._copied_from_cuda and not overlap:
            torch.cuda.current_stream().synchronize()
        elif self._copied_from_cuda:
            self.copies.main = torch.cuda.Event()
            self.copies.main.record(torch.cuda.current_stream())
            if self._side_used:
                self.copies.side = torch.cuda.Event()
                self.copies.side.record(self._side_stream)
                self._side_pending = self.copies.side
        return copy

    def copy_host(self, state: Any) -> Any:
        """``state``, whose tensors are on the host already (a pinned staging copy), copied into this
        snapshot's buffers as ``take`` would, but safe from a background thread: plain copies, and the
        process's intra-op thread count left alone."""
        self._stable, self._cpu_stable, self._deferred, self._copied_from_cuda = (), (), [], False
        return self._walk(state, "")

    def wait_for_side_copies(self) -> float:
        """Block until the side-stream copies of the last ``take`` are done (the loop calls this
        before ``optimizer.step``); seconds waited, 0.0 when nothing was pending."""
        event, self._side_pending = self._side_pending, None
        if event is None or event.query():
            return 0.0
        started = time.perf_counter()
        event.synchronize()
        return time.perf_counter() - started

    def _walk(self, obj: Any, path: str) -> Any:
        if isinstance(obj, Plain):
            return obj
        dtensor = _dtensor()
        if dtensor is not None and isinstance(obj, dtensor):  # its local shard, in a DTensor of the same layout
            local = self._copy_tensor(obj.to_local(), path)
            # built as DCP's own staging builds it: from_local would move the host copy back to the mesh's device
            return dtensor(local, obj._spec, requires_grad=False)
        if isinstance(obj, torch.Tensor):
            return self._copy_tensor(obj, path)
        if isinstance(obj, dict):
            return {k: self._walk(v, f"{path}/{k}") for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            if only_scalars(obj):  # Python's RNG state: 625 ints, not walked one by one
                return list(obj) if isinstance(obj, list) else obj
            items = [self._walk(v, f"{path}/{i}") for i, v in enumerate(obj)]
            return items if isinstance(obj, list) else tuple(items)
        return obj  # ints, floats, strings, None: immutable

    def _copy_tensor(self, tensor: torch.Tensor, path: str) -> torch.Tensor:
        buf = self._buffers.get(path)
        if buf is None or buf.shape != tensor.shape or buf.dtype != tensor.dtype:
            if self.shared is not None:
                if buf is not None:
                    self.shared.release(buf)
                buf = self.shared.allocate(tensor.shape, tensor.dtype)
            else:
                pin = self.pin_memory and tensor.is_cuda
                buf = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
            self._buffers[path] = buf
        non_blocking = tensor.is_cuda and buf.is_pinned()
        source = tensor.detach()
        if not tensor.is_cuda and self._cpu_stable and storage_key(tensor) in self._cpu_stable:
            self._deferred.append((buf, source))  # copied by a thread (ThreadCopies) once the walk is done
        elif tensor.is_cuda and self._stable and storage_key(tensor) in self._stable:
            with torch.cuda.stream(self._side_stream):
                buf.copy_(source, non_blocking=non_blocking)
            source.record_stream(self._side_stream)  # its memory is not reused before the copy ran
            self._side_used = True
        else:
            buf.copy_(source, non_blocking=non_blocking)
        self._copied_from_cuda |= tensor.is_cuda
        return buf
