"""The checkpoint format: ``torch.save`` of a dict of tensors and plain values, with its sha256.

Loading always uses ``weights_only=True``: a checkpoint can carry tensors, numbers, strings and
containers of them, never code.

The metrics rows (top-level ``metrics``) are stored as JSON lines, the text of ``metrics.jsonl``
(``RowLines``): pickled as a list of dicts, their thousands of small objects went one by one
through torch.save's Python-level pickler, a cost that grew with every validation. A float's
JSON form is its shortest exact repr, so the rows' numbers read back equal (a NaN as a NaN, its
sign bit lost); checkpoints that hold a list load as before (``rows_of``). FORMAT_VERSION stays 1:
a baton from before this change would read the text as a list of characters (left as it is: a
worker fleet is upgraded whole, not attempt by attempt).

torch is imported where a checkpoint is written or read, not with this module: the client
(``baton status``, ``submit``, ``fetch``...) needs only ``sha256_of`` and starts 2-3 s sooner.
"""
from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any, BinaryIO, Optional

from baton.schemas.errors import CheckpointCorrupt, CheckpointUnloadable, CheckpointWriteFailed

FORMAT_VERSION = 1
ROWS_KEY = "metrics"
SHARDS_KEY = "shards"
"""In the state of a sharded checkpoint: the local directory it was downloaded to (verified), which
every rank loads from; the rest of that state is rank 0's own file."""


class RowLines:
    """The JSON lines of a growing list of metrics rows, each row encoded once: a list that only
    grows (one attempt's rows) costs the new rows only; any other list is encoded anew."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._last: Any = None  # the last row encoded: the check that a list continues the previous one

    def encode(self, rows: list[dict]) -> str:
        known = len(self._lines)
        if not (known <= len(rows) and (known == 0 or rows[known - 1] is self._last or rows[known - 1] == self._last)):
            self._lines, known = [], 0
        self._lines.extend(json.dumps(row) + "\n" for row in rows[known:])
        self._last = rows[-1] if rows else None
        return "".join(self._lines)


def rows_of(stored: Any) -> list[dict]:
    """The metrics rows a checkpoint holds: JSON lines (this format) or a list (earlier checkpoints)."""
    if isinstance(stored, str):
        return [json.loads(line) for line in stored.splitlines() if line]
    return list(stored)


class _HashingWriter(io.RawIOBase):
    """A write-only file that hashes and counts what passes through to the real file, and keeps the
    OSError a write met (torch.save reports it as a RuntimeError of its own: "unexpected pos")."""

    def __init__(self, fh: BinaryIO):
        self._fh = fh
        self.sha256 = hashlib.sha256()
        self.size = 0
        self.error: Optional[OSError] = None

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        view = memoryview(data)
        self.sha256.update(view)
        self.size += view.nbytes
        try:
            self._fh.write(view)
        except OSError as exc:
            self.error = exc
            raise
        return view.nbytes

    def flush(self) -> None:
        self._fh.flush()


def save_to_file(state: dict[str, Any], path: Path) -> tuple[int, str]:
    """Serialize ``state`` to ``path``; returns ``(size, sha256 hex)`` of the bytes written. A file
    this machine cannot write (a full disk, an I/O error) is CheckpointWriteFailed."""
    import torch

    writer = None
    try:
        with open(path, "wb") as fh:
            writer = _HashingWriter(fh)
            torch.save(state, writer)
            writer.flush()
            return writer.size, writer.sha256.hexdigest()
    except OSError as exc:
        raise CheckpointWriteFailed(f"could not write the checkpoint file {path}: {exc}") from exc
    except RuntimeError as exc:
        if writer is None or writer.error is None:
            raise
        raise CheckpointWriteFailed(f"could not write the checkpoint file {path}: {writer.error}") from exc


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_bytes(data: bytes, expected_sha256: str | None = None, where: str = "checkpoint") -> dict[str, Any]:
    """Verify the digest (when given), then ``torch.load(weights_only=True)`` onto the CPU.

    Bytes that do not match the digest are CheckpointCorrupt. Bytes that match it but cannot be
    loaded are CheckpointUnloadable: they are exactly what was committed, so the fault is in this
    environment (another torch, out of memory), not in the checkpoint. Without a digest a load
    failure cannot be told apart from corruption and is CheckpointCorrupt."""
    import torch

    verified = expected_sha256 is not None
    if verified and sha256_of(data) != expected_sha256:
        raise CheckpointCorrupt(f"{where}: sha256 does not match the committed digest")
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # which error type depends on torch and on the failure: keep the cause
        if verified:
            raise CheckpointUnloadable(
                f"{where}: sha256 verified, but torch {torch.__version__} cannot load it here: "
                f"{type(exc).__name__}: {exc}") from exc
        raise CheckpointCorrupt(f"{where}: cannot be loaded: {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
        if verified:
            raise CheckpointUnloadable(f"{where}: sha256 verified, but it is not a baton checkpoint of format "
                                       f"{FORMAT_VERSION} (written by another baton version?)")
        raise CheckpointCorrupt(f"{where}: not a baton checkpoint of format {FORMAT_VERSION}")
    return state
