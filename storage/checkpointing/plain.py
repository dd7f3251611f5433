"""What a snapshot keeps by reference rather than copying: ``Plain`` values (no tensors inside) and
lists of immutable scalars. The snapshot (``snapshot.py``), its shared buffers (``shared_buffers.py``)
and the writer read these; none of them imports another for it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Plain:
    """A top-level value of a state that the snapshot keeps by reference instead of walking it:
    it holds no tensors and nothing modifies it after the capture (the metrics rows: walked,
    their thousands of numbers cost the loop more with every epoch). The writer unwraps it
    (``unwrap``) just before serializing, so a checkpoint never holds a Plain."""

    value: Any


SCALARS = frozenset({int, float, bool, str, bytes, type(None)})


def only_scalars(items: Any) -> bool:
    """Whether a list or tuple holds immutable scalars only (checked without a Python loop)."""
    return set(map(type, items)) <= SCALARS


def unwrap(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with its top-level Plain values replaced by what they hold."""
    return {k: v.value if isinstance(v, Plain) else v for k, v in state.items()}
