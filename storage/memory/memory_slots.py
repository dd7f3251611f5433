"""Where the last step in memory lives, and reading it back (``memory_copy`` writes it).

A job's copies live in directories its worker makes and keeps (``memory_dirs``). In them, two
*slots*: each a directory of buffer files (``shared_buffers``) and a record, ``slot-<i>.meta``
(``Record``: sequence number, step, position, the state's structure with each tensor replaced by its
file, a CRC-32 per file), written with ``torch.save`` and read with ``torch.load(weights_only=True)``,
these types allowed.

``newest`` takes the record with the highest sequence number whose files match their digests, and
loads it (cloned out of the buffers: a loaded optimizer keeps the tensors it is given). ``forget``
unpublishes both slots.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from baton.storage.checkpointing.shared_buffers import MappedBuffers, Slot
from baton.storage.checkpointing.plain import Plain, unwrap

SLOTS = 2


def record_path(dirs: list[Path], slot: int) -> Path:
    """A slot's record: in the first directory, beside the slots' own directories."""
    return dirs[0] / f"slot-{slot}.meta"


def slot_dirs(dirs: list[Path], slot: int) -> list[Path]:
    return [directory / f"slot-{slot}" for directory in dirs]


@dataclass(frozen=True)
class Record:
    seq: int
    step: int
    epoch: int
    batch_in_epoch: int
    skeleton: Any  # the state with each tensor in a file replaced by its Slot
    digests: dict[str, int]  # file -> CRC-32 of its bytes


RECORD_TYPES = (Record, Slot, Plain)
"""All a record holds besides what ``torch.load(weights_only=True)`` accepts anyway."""


def read_record(path: Path) -> Optional[Record]:
    try:
        with torch.serialization.safe_globals(list(RECORD_TYPES)):
            record = torch.load(path, weights_only=True)
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - cut short or not a record: the slot holds no copy
        return None
    return record if isinstance(record, Record) else None


def forget(dirs: list[Path]) -> None:
    """Unpublish every copy: a resume that did not take them leaves another lineage of the job's state,
    which a later attempt must never resume from."""
    for slot in range(SLOTS):
        record_path(dirs, slot).unlink(missing_ok=True)


def crc(tensor: torch.Tensor) -> int:
    return zlib.crc32(tensor.reshape(-1).view(torch.uint8).numpy())


@dataclass
class InMemoryState:
    """A verified copy: the state (ordinary tensors, as a checkpoint loads) and where it was taken."""

    step: int
    epoch: int
    batch_in_epoch: int
    slot: int
    state: dict[str, Any]


def newest(dirs: list[Path], log: Callable[[str], None] = print) -> Optional[InMemoryState]:
    """The newest copy whose files match their digests, loaded (cloned out of the buffers); None if
    there is none. A copy that does not verify is reported, discarded (its record removed: the next
    copy goes into its slot, not into the one resumed from) and the one before it tried."""
    records = [(slot, read_record(record_path(dirs, slot))) for slot in range(SLOTS)]
    for slot, record in sorted(((s, r) for s, r in records if r is not None), key=lambda sr: -sr[1].seq):
        try:
            state = MappedBuffers().from_slots(record.skeleton)
            tensors = {s.path: t for s, t in slots_and_tensors(record.skeleton, state)}
            bad = [path for path, digest in record.digests.items() if path not in tensors or crc(tensors[path]) != digest]
        except (OSError, RuntimeError, ValueError) as exc:  # a file gone or cut short
            log(f"in-memory copy of step {record.step} (slot {slot}) cannot be read ({type(exc).__name__}: {exc}); "
                "discarded, trying the one before it")
            record_path(dirs, slot).unlink(missing_ok=True)
            continue
        if bad:
            log(f"in-memory copy of step {record.step} (slot {slot}) does not match its digest ({len(bad)} file(s)); "
                "discarded, trying the one before it")
            record_path(dirs, slot).unlink(missing_ok=True)
            continue
        return InMemoryState(record.step, record.epoch, record.batch_in_epoch, slot, _clone(unwrap(state)))
    return None


def _clone(obj: Any) -> Any:
    """Tensors out of the mapped files: a loaded optimizer keeps the tensors it is given."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_clone(v) for v in obj)
    return obj


def slots_and_tensors(skeleton: Any, snapshot: Any):
    """(Slot, its buffer) pairs, walking the skeleton and the snapshot side by side."""
    if isinstance(skeleton, Slot):
        yield skeleton, snapshot
    elif isinstance(skeleton, dict):
        for key, value in skeleton.items():
            yield from slots_and_tensors(value, snapshot[key])
    elif isinstance(skeleton, (list, tuple)):
        for value, other in zip(skeleton, snapshot):
            yield from slots_and_tensors(value, other)

