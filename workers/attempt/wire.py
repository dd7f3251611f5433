"""What a training process may say to its worker, as data: each message JSON, checked against the one
shape its kind and method allow before the worker acts on it (``channel``, ``process``).

The training process runs the job's code, and that code can write anything into the pipe it inherits.
Were messages pickled, as multiprocessing sends objects, a job could make its worker run code of its
choosing with one write (a pickle's ``__reduce__``): the worker's Redis and store credentials, every
other job. So this direction of the pipe carries only JSON (NaN and the infinities included: a diverged
loss), and only the messages below, each validated by pydantic; anything else (a pickle, an unknown
method, a field of the wrong type, a message over ``MAX_BYTES``) is ``Refused``, and the worker ends the
attempt as the job's failure (``process.TrainingProcess.serve``). What the worker sends back (replies,
a request for stacks) is still pickled: the training process trusts its worker, not the other way round.
"""
from __future__ import annotations

import json
from enum import Enum
from multiprocessing.connection import Connection
from typing import Any, Optional

from pydantic import JsonValue, TypeAdapter, ValidationError

from baton.schemas.errors import BatonError
from baton.schemas.manifest import CheckpointManifest
from baton.schemas.messages import AttemptEnd
from baton.storage.checkpointing.contract import CheckpointStats
from baton.workers.parallel.peer_calls import ANNOUNCE, REMOTE_FAILURE
from baton.workers.training.control import StepReport

MAX_BYTES = 8 << 20
"""The largest message the worker reads (the largest real one, a thread dump or a long manifest, is a
few hundred KiB)."""

ARGUMENTS: dict[tuple[str, str], TypeAdapter] = {
    ("tell", "on_step"): TypeAdapter(tuple[StepReport, int]),
    ("tell", "on_epoch"): TypeAdapter(tuple[dict[str, JsonValue]]),
    ("tell", "on_resume"): TypeAdapter(tuple[int, int, int, int, str]),
    ("tell", "on_commit"): TypeAdapter(tuple[CheckpointManifest, CheckpointStats]),
    ("call", "fence"): TypeAdapter(tuple[()]),
    ("call", ANNOUNCE): TypeAdapter(tuple[Optional[str], str, str]),
    ("call", REMOTE_FAILURE): TypeAdapter(tuple[()]),
}
"""Every (kind, method) a training process may send, and its arguments' types."""

BODIES: dict[str, TypeAdapter] = {"end": TypeAdapter(AttemptEnd), "stacks": TypeAdapter(str)}
"""The messages that carry one value instead of a method's arguments."""


class Refused(BatonError):
    """A message from the training process that is not one it may send."""


def encode(message: tuple) -> bytes:
    """``(kind, id, (method, args))`` or ``(kind, id, body)`` as the bytes the worker reads."""
    kind, call_id, body = message
    if kind in BODIES:
        return _dumps([kind, call_id, None, BODIES[kind].dump_python(body)])
    method, args = body
    return _dumps([kind, call_id, method, ARGUMENTS[(kind, method)].dump_python(tuple(args))])


def decode(data: bytes) -> tuple:
    """The message ``encode`` made, its values typed again; ``Refused`` if it is anything else."""
    try:
        kind, call_id, method, payload = json.loads(data)
    except (ValueError, TypeError, RecursionError) as exc:  # (UnicodeDecodeError, JSONDecodeError: ValueErrors)
        raise Refused(f"not a message of the channel's ({_excerpt(data)})") from exc
    if not isinstance(call_id, int) or isinstance(call_id, bool) or not isinstance(kind, str):
        raise Refused(f"not a message of the channel's ({_excerpt(data)})")
    try:
        if kind in BODIES and method is None:
            body = BODIES[kind].validate_python(payload)
            if kind == "end" and (body.outcome is None) == (body.failure is None):
                raise Refused("end: an attempt's end holds exactly one of outcome and failure")
            return kind, call_id, body
        adapter = ARGUMENTS.get((kind, method)) if isinstance(method, str) else None
        if adapter is None:
            raise Refused(f"no such message: {kind} {method!r}")
        args = adapter.validate_python(payload)
        _check_bounds(kind, method, args)
        return kind, call_id, (method, args)
    except ValidationError as exc:
        first = exc.errors()[0]
        named = f"{kind} {method}" if isinstance(method, str) else kind
        raise Refused(f"{named}: {first['msg']} at {first['loc']}") from exc


COUNT_LIMIT = 1 << 53
"""Steps, epochs, attempts and bytes are counts: 0 up to this (a float's exact integers), nothing else."""


def _check_bounds(kind: str, method: str, args: tuple) -> None:
    """What the types let through but the worker's records cannot take: a negative or vast count."""
    counts: list[Any] = []
    if method == "on_step":
        report, steps = args
        counts = [report.epoch, report.epochs, report.step, report.total_steps, steps]
    elif method == "on_resume":
        counts = list(args[:4])
    elif method == "on_commit":
        stats = args[1]
        counts = [stats.bytes]
        if not (stats.stall_s >= 0 and stats.write_s >= 0):  # (False for a NaN too)
            raise Refused(f"{kind} {method}: a negative or NaN time")
    if any(count is not None and not 0 <= count < COUNT_LIMIT for count in counts):
        raise Refused(f"{kind} {method}: a count out of range ({counts})")


def receive(conn: Connection) -> Optional[tuple]:
    """The next message from ``conn``, decoded; None once the other end is closed."""
    try:
        data = conn.recv_bytes(MAX_BYTES)
    except (EOFError, OSError):
        if not conn.closed and not conn.readable:  # multiprocessing's sign of a message over the limit
            raise Refused(f"a message over {MAX_BYTES >> 20} MiB") from None
        return None
    return decode(data)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, default=_plain, separators=(",", ":")).encode()


def _plain(value: Any) -> Any:
    """What pydantic's python-mode dump leaves that JSON has no type for."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} cannot cross the channel")


def _excerpt(data: bytes) -> str:
    return f"{len(data)} bytes, starting {data[:24]!r}"
