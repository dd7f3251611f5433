"""The last step in memory: the training state copied into host memory every few optimizer steps, so
that the next attempt on this machine, after the training process died, resumes from it instead of
from the last durable checkpoint.

The worker keeps the copies' directories for the next training process it starts (``memory_dirs``;
``memory_slots``: the records, reading the newest back). A training process copies its state into one
of two *slots* there, in turn:

1. the slot's record (``slot-<i>.meta``) is removed: from here the slot holds nothing a reader takes;
2. every tensor is copied into the slot's buffer files (``shared_buffers``; on CUDA first into pinned
   host memory, asynchronously, then by a background thread into the files);
3. each file's CRC-32 is computed, then the record (sequence number, step, position, the state's
   structure, the digests) is written under a temporary name and renamed into place.

On the CPU all of it happens before the loop goes on, so a crash at any moment finds the last
completed step published, or (during its copy) the one before it: the next attempt redoes at most
one step. On CUDA steps 2 and 3 run in a background thread beside the next step's GPU work, so a
crash may also lose the step whose copy was still being published.

A reader (``memory_slots.newest``) takes the record with the highest sequence number whose files match
their digests: a process killed during a copy leaves that slot without a record, while the other slot,
published before, is whole. A slot is written again only after the other one has been published
since: a copy waits for the previous one's publication to finish.

How often: every ``every`` steps, or (``every=None``) every k steps with k the smallest that keeps
the copies' cost within ``BUDGET`` of the training time between them. The cost counted is what the
loop waits for (on the CPU the whole copy and publication; on CUDA the capture and the launch of the
device-to-host copies); on CUDA k is also long enough for a publication to end before the next copy.
Copies that allocated their buffers (the first into each slot) are not counted.

Nothing here can fail a job: a copy that fails (no room anywhere, say) is logged, and no more copies
are taken by that process; the durable checkpoints go on as before.
"""
from __future__ import annotations

import math
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Optional

import torch

from baton.storage import failpoints
from baton.storage.memory.memory_slots import SLOTS, Record, crc, read_record, record_path, slot_dirs, slots_and_tensors
from baton.storage.processes import own_cgroup
from baton.storage.checkpointing.shared_buffers import SharedBuffers
from baton.storage.checkpointing.plain import only_scalars
from baton.storage.checkpointing.snapshot import Copies, HostSnapshot

BUDGET = 0.03
"""The share of training time the copies may cost when their interval is chosen (CheckFreq's bound)."""
EVERY_MAX = 1000
"""The longest interval ``auto`` chooses."""
SETTLED_AFTER = 5
"""An interval chosen this many times in a row has settled: then, if it is at least twice or half the
one last said, it is said (the log shows a change once, not every choice of a noisy measurement)."""
ROOM_SHARE = 0.5
"""The copies (two slots, and on CUDA the pinned staging copy) may take at most this share of the
memory left when the first is taken (the container's cgroup limit, else the machine's available
memory): /dev/shm is memory, and a job must not be pushed into the OOM killer by its own copies."""


@dataclass
class MemoryCopyStats:
    taken: int = 0
    every: int = 1  # the current interval, in optimizer steps
    stall_s: float = 0.0  # what the loop waited, in all
    cost_share: float = 0.0  # the last estimate of the copies' cost over the training time between them

    def describe(self) -> str:
        return (f"in-memory copies: {self.taken} taken, every {self.every} step(s), about {self.cost_share:.1%} of "
                "training time")


@dataclass
class _Slot:
    index: int
    dirs: list[Path]  # its own directory in each of the copies' directories
    meta: Path
    log: Callable[[str], None]
    buffers: Optional[SharedBuffers] = None
    snapshot: Optional[HostSnapshot] = None
    allocated: bool = False  # whether a copy into it allocated its buffers (not counted in the cost)

    @property
    def host(self) -> HostSnapshot:
        """Its snapshot (made when the slot is cleared, before any copy into it)."""
        assert self.snapshot is not None
        return self.snapshot

    @property
    def files(self) -> SharedBuffers:
        """Its buffers (made with its snapshot)."""
        assert self.buffers is not None
        return self.buffers

    def clear(self) -> None:
        """Unpublish, then empty: the next copy into it starts from nothing (another process wrote it)."""
        self.meta.unlink(missing_ok=True)
        for directory in self.dirs:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(mode=0o700)
        self.buffers = SharedBuffers.within(self.dirs, self.log)
        self.snapshot = HostSnapshot(shared=self.buffers)


@dataclass
class MemoryCopier:
    """The training process's side: ``due(step)`` after each optimizer step, then ``take``."""

    dirs: list[Path]
    every: Optional[int] = None  # None: chosen from the measured cost (see the module's docstring)
    cuda: bool = False
    log: Callable[[str], None] = print
    stats: MemoryCopyStats = field(default_factory=MemoryCopyStats)

    def __post_init__(self) -> None:
        self.dirs = [Path(d) for d in self.dirs]
        records = [read_record(record_path(self.dirs, s)) for s in range(SLOTS)]
        seqs = [r.seq if r is not None else -1 for r in records]
        newest_slot = max(range(SLOTS), key=lambda s: seqs[s])
        self._seq = max(seqs) + 1
        self._next = (newest_slot + 1) % SLOTS  # never first into the slot a resume may still need
        self._slots = [_Slot(i, slot_dirs(self.dirs, i), record_path(self.dirs, i), self.log) for i in range(SLOTS)]
        self._fresh = set(range(SLOTS))  # slots this process has not cleared yet
        self._publishing: Optional[threading.Thread] = None
        self._failed = False
        self._room_checked = False
        self._said: Optional[int] = None  # the interval last logged
        self._choice: tuple[int, int] = (0, 0)  # the interval last chosen, and how many times in a row
        self._staging = HostSnapshot(pin_memory=True) if self.cuda else None
        self.stats.every = self.every or 1
        self._last_step_at: Optional[float] = None
        self._step_s: Optional[float] = None  # training time per step, smoothed
        self._cost_s: Optional[float] = None  # one copy's cost, smoothed
        self._since_copy = 0

    # --- called by the loop -------------------------------------------------------------------
    def due(self, step: int) -> bool:
        """Called once per optimizer step: whether to take a copy now."""
        now = time.perf_counter()
        if self._last_step_at is not None:
            elapsed = now - self._last_step_at
            self._step_s = elapsed if self._step_s is None else 0.8 * self._step_s + 0.2 * elapsed
        self._last_step_at = now
        self._since_copy += 1
        return not self._failed and self._since_copy >= self.stats.every

    def take(self, capture: Callable[[], dict[str, Any]], step: int, epoch: int, batch_in_epoch: int,
             stable: Optional[Collection[int]] = None) -> None:
        """Copy ``capture()`` into the next slot and publish it (on CUDA, the publication finishes in the
        background while the loop goes on)."""
        started = time.perf_counter()
        slot = self._slots[self._next]
        try:
            if self._publishing is not None:
                self._publishing.join()  # the previous copy's publication (part of this stall); its error was logged
            if slot.index in self._fresh:
                slot.clear()
                self._fresh.discard(slot.index)
            else:
                slot.meta.unlink(missing_ok=True)
            allocating = not slot.allocated
            state = capture()
            if not self._room_checked:
                self._room_checked = True
                why = no_room(state_bytes(state) * (SLOTS + (1 if self.cuda else 0)))
                if why is not None:
                    self._give_up(why)
                    return
            if failpoints.armed("memory-copy-torn", step):  # a test's crash halfway through this copy
                slot.host.take({k: state[k] for k in list(state)[: len(state) // 2]})
                failpoints.die()
            if self._staging is not None:  # CUDA: the device-to-host copy overlaps the next step
                snapshot, copies = self._staging.take(state, stable), self._staging.copies
            else:
                snapshot, copies = slot.host.take(state), Copies()
        except Exception as exc:  # noqa: BLE001 - a copy must never fail the job
            self._give_up(exc)
            return
        slot.allocated = True
        stall = time.perf_counter() - started
        self.stats.taken += 1
        self.stats.stall_s += stall
        self._since_copy = 0
        self._next = (slot.index + 1) % SLOTS
        record = dict(seq=self._seq, step=step, epoch=epoch, batch_in_epoch=batch_in_epoch)
        self._seq += 1
        if self._staging is None:  # the CPU: published before the loop goes on (a crash redoes one step at most)
            self._publish(slot, snapshot, copies, record, stall, allocating)
        else:
            self._publishing = threading.Thread(target=self._publish, args=(slot, snapshot, copies, record, stall,
                                                                             allocating),
                                                name="baton-memory-copy", daemon=True)
            self._publishing.start()
        self._last_step_at = time.perf_counter()  # the copy is not training time

    def before_optimizer_step(self) -> None:
        """CUDA: wait for the staging copy still reading the parameters (a no-op on the CPU)."""
        if self._staging is not None:
            self.stats.stall_s += self._staging.wait_for_side_copies()

    def close(self) -> None:
        """Wait for the copy being published (the next training process may read it)."""
        if self._publishing is not None:
            self._publishing.join()

    # --- background -----------------------------------------------------------------------------
    def _publish(self, slot: _Slot, snapshot: Any, copies: Copies, record: dict, stall: float,
                 allocating: bool) -> None:
        started = time.perf_counter()
        try:
            copies.wait_all()
            if self._staging is not None:  # pinned staging -> the slot's files (the loop has moved on)
                snapshot = slot.host.copy_host(snapshot)
            skeleton = slot.files.to_slots(snapshot)
            digests = {s.path: crc(t) for s, t in slots_and_tensors(skeleton, snapshot)}
            meta = slot.meta
            partial = meta.with_suffix(".partial")
            torch.save(Record(skeleton=skeleton, digests=digests, **record), partial)
            os.replace(partial, meta)
        except Exception as exc:  # noqa: BLE001
            self._give_up(exc)
            return
        publish = time.perf_counter() - started
        if not allocating:
            self._update_interval(stall + (0.0 if self.cuda else publish), publish)  # CPU: both held the loop

    def _update_interval(self, cost: float, publish: float) -> None:
        self._cost_s = cost if self._cost_s is None else 0.7 * self._cost_s + 0.3 * cost
        if self._step_s is None or self._step_s <= 0:
            return
        if self.every is None:
            every = math.ceil(self._cost_s / (BUDGET * self._step_s))
            if self.cuda:  # the publication runs beside the GPU's work, and must end before the next copy
                every = max(every, math.ceil(publish / self._step_s))
            every = min(EVERY_MAX, max(1, every))
            self._choice = (every, self._choice[1] + 1 if self._choice[0] == every else 1)
            settled = self._choice[1] == SETTLED_AFTER
            if settled and (self._said is None or not self._said / 2 < every < self._said * 2):
                self.log(f"in-memory copies every {every} step(s): a copy costs {self._cost_s * 1e3:.1f} ms, "
                         f"a step {self._step_s * 1e3:.1f} ms")
                self._said = every
            self.stats.every = every
        self.stats.cost_share = self._cost_s / (self._step_s * self.stats.every)

    def _give_up(self, why: "BaseException | str") -> None:
        if not self._failed:
            self._failed = True
            reason = why if isinstance(why, str) else f"{type(why).__name__}: {why}"
            self.log(f"in-memory copies stopped ({reason}); a crash resumes from the last durable checkpoint")


def state_bytes(obj: Any) -> int:
    """The bytes of the tensors in a captured state."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)) and not only_scalars(obj):
        return sum(state_bytes(v) for v in obj)
    return 0


def no_room(needed: int) -> Optional[str]:
    """Why copies of ``needed`` bytes in all would crowd the memory left, or None."""
    left = memory_left()
    if left is None or needed <= ROOM_SHARE * left:
        return None
    return (f"the copies would take {needed / 2**20:.0f} MiB, more than {ROOM_SHARE:.0%} of the "
            f"{left / 2**20:.0f} MiB of memory left")


def memory_left() -> Optional[int]:
    """Bytes this process may still take: the least of its cgroup's room (cgroup v2 memory.max less
    memory.current) and the machine's MemAvailable; None where neither can be read."""
    found = []
    try:
        group = own_cgroup()
        limit = (group / "memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int((group / "memory.current").read_text()))
    except (OSError, IndexError, ValueError):
        pass
    try:
        for entry in Path("/proc/meminfo").read_text().splitlines():
            if entry.startswith("MemAvailable:"):
                found.append(int(entry.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return min(found) if found else None

