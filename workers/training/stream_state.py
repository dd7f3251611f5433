"""A stream's loader state, made fit for a checkpoint: everything in it loads back under
``torch.load(weights_only=True)``, as every checkpoint is loaded.

The state is torchdata's own counters plus each data-set copy's ``state_dict()``: user code, where
numpy values are common, and weights_only refuses every numpy object. So:

- a numpy scalar or array of a dtype torch has (bool, the integer and floating types, complex) is
  stored as a tensor holding the same bits, tagged, and given back on resume as a numpy value of
  the same type and bits: the stream goes on with exactly what it had (a Python int or float in
  its place would change its arithmetic: float32 would become float64, an int64 would not wrap);
- anything else weights_only refuses fails the job at the checkpoint it would go into (the first
  one, unless the state changes later), naming its place in ``state_dict()`` and its type: a
  checkpoint the job could never resume from is never committed.
"""
from __future__ import annotations

import io
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from baton.schemas.errors import UserCodeError

TAG = "__baton_numpy__"
"""The key of a numpy value's stand-in: ``{TAG: "scalar" | "array", "value": tensor}``."""
LOADABLE = frozenset({int, float, bool, complex, str, bytes, type(None), torch.Tensor, torch.nn.Parameter,
                      torch.Size, torch.dtype, torch.device})
"""Types weights_only loads (checked without a trial round trip)."""
KEY_TYPES = frozenset({int, float, bool, str, type(None)})
NESTED_STATES = {"dataset_state": "state_dict()", "dataset_iter_state": "the iterator's state_dict()"}
"""Where torchdata keeps the data set's own state (each loader worker's too): paths restart there, so an
error names the place in the user's ``state_dict()``, not in the loader's."""


class StreamStateUnloadable(UserCodeError):
    """A stream's ``state_dict()`` holds a value no checkpoint could be resumed from."""


def to_checkpoint(state: Any, owner: str) -> Any:
    """``state`` with numpy values replaced by their stand-ins; StreamStateUnloadable (naming
    ``owner``, the data target) for a value weights_only would refuse."""
    return _encode(state, "the loader's state", owner)


def from_checkpoint(state: Any) -> Any:
    """``state`` as ``to_checkpoint`` was given it: numpy values back in place of their stand-ins."""
    if type(state) in (dict, OrderedDict):
        if set(state) == {TAG, "value"}:
            array = state["value"].numpy()
            return array[()] if state[TAG] == "scalar" else array
        return type(state)((k, from_checkpoint(v)) for k, v in state.items())
    if type(state) in (list, tuple):
        return type(state)(from_checkpoint(v) for v in state)
    return state


def _encode(value: Any, where: str, owner: str) -> Any:
    kind = type(value)
    if kind in LOADABLE:
        return value
    if kind in (dict, OrderedDict):
        for key in value:
            if type(key) not in KEY_TYPES:
                _refuse(f"the key {key!r} in {where}", key, owner)
        return kind((k, _encode(v, NESTED_STATES.get(k) or f"{where}[{k!r}]", owner)) for k, v in value.items())
    if kind in (list, tuple):
        return kind(_encode(v, f"{where}[{i}]", owner) for i, v in enumerate(value))
    if isinstance(value, (np.generic, np.ndarray)):
        return _numpy(value, where, owner)
    if not _loads_weights_only(value):
        _refuse(where, value, owner)
    return value


def _numpy(value: Any, where: str, owner: str) -> dict:
    try:  # a copy: the stream may change its array after this capture
        tensor = torch.from_numpy(np.array(value, copy=True))
    except TypeError:  # a dtype torch lacks (longdouble, datetime64, str_, object...)
        _refuse(where, value, owner, f" (numpy dtype {value.dtype}, which torch has no tensor type for)")
    return {TAG: "scalar" if isinstance(value, np.generic) else "array", "value": tensor}


def _loads_weights_only(value: Any) -> bool:
    """Whether a value of a type not known here round-trips through torch.save and
    torch.load(weights_only=True): torch itself is the judge of what it loads."""
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
    except Exception:  # not picklable, or refused by the weights-only unpickler: no checkpoint can hold it
        return False
    return True


def _refuse(where: str, value: Any, owner: str, detail: str = "") -> None:
    kind = type(value)
    raise StreamStateUnloadable(
        f"data target {owner}: {where} is a {kind.__module__}.{kind.__qualname__}{detail}, which "
        "torch.load(weights_only=True) refuses, so a checkpoint holding it could never be resumed from. "
        "Keep Python numbers, strings, tensors, numpy scalars and arrays, and lists and dicts of them in "
        "state_dict() (a numpy Generator: its bit_generator.state; a torch.Generator: its get_state())")
