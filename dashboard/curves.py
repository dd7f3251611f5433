"""A job's metrics rows for its page and its API, fast enough for 100,000 rows: the committed
``metrics.jsonl`` (found through the manifest, checked against its sha256) is kept as bytes while the
manifest names the same object, and served as it is, spliced into one JSON array, never parsed here
(the browser parses it far faster than Python can). Rows are in step order: those past a step are
found by a binary search that reads a dozen of them.

Python's ``json`` writes a non-finite value as ``NaN``/``Infinity``, which JSON does not allow: those
become ``null`` (a row's only strings are object keys, which hold neither ``:`` nor ``,``)."""
from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Optional

from baton.schemas.manifest import CheckpointManifest
from baton.storage.artifacts import read_verified
from baton.storage.stores.base import ObjectStore

CACHED_JOBS = 8
NON_FINITE = re.compile(rb"(?<=[:,\[])(\s*)(?:NaN|-?Infinity)(?=\s*[,\]}])")
_STEP = re.compile(rb'"step":\s*(-?\d+)')


def step_of(line: bytes) -> int:
    found = _STEP.search(line)
    return int(found[1]) if found else json.loads(line)["step"]


def after(lines: list[bytes], since: int) -> list[bytes]:
    """The lines whose step is past ``since`` (lines in step order)."""
    low, high = 0, len(lines)
    while low < high:
        middle = (low + high) // 2
        if step_of(lines[middle]) <= since:
            low = middle + 1
        else:
            high = middle
    return lines[low:]


def as_json_array(lines: list[bytes]) -> bytes:
    body = b"[" + b",".join(lines) + b"]"
    if b"NaN" in body or b"Infinity" in body:
        body = NON_FINITE.sub(rb"\1null", body)
    return body


PAGE_ROWS = 10_000
"""The most rows a job page draws at first: a longer run is sampled evenly (every k-th row, and the last),
as TensorBoard and W&B sample their charts; the page offers all of them on request."""


class Rows:
    """One metrics object's rows: its lines, and what a page asks first (every row, or a sample) kept."""

    def __init__(self, lines: list[bytes]):
        self.lines = lines
        self.last_step = step_of(lines[-1]) if lines else -1
        self._kept: dict[int, tuple[bytes, int]] = {}

    def after(self, since: int, most: int = 0) -> tuple[bytes, int, int, int]:
        """The rows past step ``since`` as a JSON array (every ``stride``-th of them, and the last, when there are
        more than ``most``; all when ``most`` is 0), the last row's step (``since`` without one), how many rows
        there are past ``since``, and the stride."""
        if since < 0 and most in self._kept:
            body, stride = self._kept[most]
            return body, self.last_step, len(self.lines), stride
        lines = after(self.lines, since) if since >= 0 else self.lines
        stride = -(-len(lines) // most) if most and len(lines) > most else 1
        chosen = lines[::stride] if stride == 1 or (len(lines) - 1) % stride == 0 else [*lines[::stride], lines[-1]]
        body = as_json_array(chosen)
        if since < 0:
            self._kept = {most: (body, stride)}
        return body, (self.last_step if lines else since), len(lines), stride


class MetricsCache:
    """Each job's committed rows, kept while its manifest names the same metrics object."""

    def __init__(self, size: int = CACHED_JOBS):
        self._size = size
        self._cached: "OrderedDict[str, tuple[str, Rows]]" = OrderedDict()
        self._lock = threading.Lock()

    def rows(self, store: ObjectStore, job_id: str, manifest: Optional[CheckpointManifest]) -> Rows:
        ref = manifest.metrics if manifest is not None else None
        if ref is None:
            return Rows([])
        with self._lock:
            hit = self._cached.get(job_id)
            if hit is not None and hit[0] == ref.key:
                self._cached.move_to_end(job_id)
                return hit[1]
        rows = Rows([line for line in read_verified(store, ref).splitlines() if line.strip()])
        with self._lock:
            self._cached[job_id] = (ref.key, rows)
            while len(self._cached) > self._size:
                self._cached.popitem(last=False)
        return rows
