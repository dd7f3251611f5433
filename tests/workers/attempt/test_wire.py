"""What a training process may send its worker (baton.workers.attempt.wire): every message it sends
comes back equal, NaN and the infinities included; anything else is refused, a pickle unloaded."""
from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import threading

import pytest

from baton.schemas.manifest import CheckpointEntry, CheckpointManifest
from baton.schemas.messages import AttemptEnd, Ending, Failure, Outcome
from baton.storage.checkpointing.contract import CheckpointStats
from baton.workers.attempt import wire
from baton.workers.parallel.peer_calls import ANNOUNCE, REMOTE_FAILURE
from baton.workers.training.control import StepReport

MANIFEST = CheckpointManifest(job_id="j", attempt=2, claim="c", checkpoints=[CheckpointEntry(
    key="jobs/j/attempt-2/step-5.pt", sha256="0" * 64, size=10, step=5, epoch=0, batch_in_epoch=5, kind="step",
    attempt=2, created_at=1.5)])
SENT = [
    ("tell", 0, ("on_step", (StepReport(1, None, 7, None, math.nan, 0.01, math.inf), 3))),
    ("tell", 0, ("on_epoch", ({"epoch": 1, "val_loss": -math.inf, "train_curve": [[1, 0.5]], "note": None},))),
    ("tell", 0, ("on_resume", (5, 0, 5, 2, "memory"))),
    ("tell", 0, ("on_commit", (MANIFEST, CheckpointStats(key="jobs/j/attempt-2/step-5.pt", kind="step", stall_s=0.01)))),
    ("call", 4, ("fence", ())),
    ("call", 5, (ANNOUNCE, (None, "secret", '{"a": 1}'))),
    ("call", 6, (REMOTE_FAILURE, ())),
    ("end", 0, AttemptEnd(outcome=Outcome(completed=False, reason="preempted", step=5), resumed_from_step=3)),
    ("end", 0, AttemptEnd(failure=Failure(ending=Ending.FAILED, message="boom", type="ValueError", step=2))),
    ("stacks", 0, "Thread MainThread (1), most recent call last:\n"),
]


def same(a, b) -> bool:
    """Equal, a NaN equal to a NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, StepReport):
        return same([getattr(a, f) for f in a.__slots__], [getattr(b, f) for f in b.__slots__])
    return a == b


@pytest.mark.parametrize("message", SENT, ids=lambda m: f"{m[0]}-{m[2][0] if m[0] in ('tell', 'call') else ''}")
def test_every_message_a_training_process_sends_arrives_equal(message):
    got = wire.decode(wire.encode(message))
    if message[0] == "tell" and message[2][0] == "on_epoch":  # JSON has lists, not tuples: a row's values stay lists
        assert same(got[2][1][0], {**message[2][1][0]})
    else:
        assert same(got, message), got
    assert b"NaN" in wire.encode(SENT[0]) and b"Infinity" in wire.encode(SENT[0])


class Marker:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def test_a_pickle_is_refused_without_being_loaded(tmp_path):
    marker = tmp_path / "loaded"
    data = pickle.dumps(("tell", 0, ("on_epoch", (Marker(str(marker)),))))
    with pytest.raises(wire.Refused, match="not a message of the channel's"):
        wire.decode(data)
    assert not marker.exists()
    pickle.loads(data)  # (the payload works: loading it would have made the marker)
    assert marker.exists()


@pytest.mark.parametrize("data, why", [
    (b'["tell",0,"kill_worker",[]]', "no such message: tell 'kill_worker'"),
    (b'["call",1,"on_step",[]]', "no such message: call 'on_step'"),  # a tell's method, as a call
    (b'["tell",0,"on_step",[{"epoch":"x"},1]]', "tell on_step: "),
    (b'["tell",0,"on_resume",[1,2,3]]', "tell on_resume: "),
    (b'["call",1,"fence",[1]]', "call fence: "),
    (b'["end",0,null,{"outcome":null,"failure":null,"resumed_from_step":null,"extra":1}]', "end: Extra inputs"),
    (b'["stacks",0,null,["not","a","string"]]', "stacks: "),
    (b'["tell",true,"on_resume",[1,2,3,4,"x"]]', "not a message of the channel's"),
    (b'["tell",0,"on_resume"]', "not a message of the channel's"),
    (b'{"kind":"tell"}', "not a message of the channel's"),
    (b'\xff\xfe', "not a message of the channel's"),
    (b'["tell",0,"on_step",[{"epoch":1,"epochs":null,"step":2,"total_steps":null,"loss":0,"lr":0,"samples_per_s":0},-5]]',
     "tell on_step: a count out of range"),
    (b'["tell",0,"on_step",[{"epoch":1,"epochs":null,"step":' + b"9" * 400 + b',"total_steps":null,"loss":0,"lr":0,'
     b'"samples_per_s":0},1]]', "tell on_step: a count out of range"),
    (b'["tell",0,"on_resume",[-1,0,0,1,"checkpoint"]]', "tell on_resume: a count out of range"),
    (b'["tell",0,"on_commit",[{"job_id":"j"},{"key":"k","kind":"step","stall_s":0.1,"bytes":-7}]]',
     "tell on_commit: a count out of range"),
    (b'["tell",0,"on_commit",[{"job_id":"j"},{"key":"k","kind":"step","stall_s":NaN}]]', "tell on_commit: a negative"),
    (b'["end",0,null,{}]', "end: an attempt's end holds exactly one of outcome and failure"),
    (b'["end",0,null,{"outcome":{"completed":true},"failure":{"ending":"failed","message":"m","type":"t"}}]',
     "end: an attempt's end holds exactly one"),
    (b'["tell",0,"on_epoch",[{"a":' + b"[" * 100_000 + b"]" * 100_000 + b'}]]', "not a message of the channel's"),
    (b'["tell",0,"on_resume",[' + b"9" * 5000 + b',0,0,0,"x"]]', "not a message of the channel's"),
], ids=lambda value: repr(value[:32]) if isinstance(value, bytes) else "")
def test_a_message_of_another_shape_is_refused_naming_what_is_wrong(data, why):
    with pytest.raises(wire.Refused) as refused:
        wire.decode(data)
    assert why in str(refused.value)


def test_a_message_over_the_limit_is_refused_unread_and_a_closed_end_is_the_end():
    reader, writer = multiprocessing.Pipe()

    def send_too_much():
        try:
            writer.send_bytes(b"x" * (wire.MAX_BYTES + 1))
        except BrokenPipeError:
            pass  # the reader closed its end once it read the length
    sender = threading.Thread(target=send_too_much)
    sender.start()
    with pytest.raises(wire.Refused, match="a message over 8 MiB"):
        wire.receive(reader)
    reader.close()
    sender.join(timeout=30)
    assert not sender.is_alive()
    reader, writer = multiprocessing.Pipe()
    writer.send_bytes(wire.encode(SENT[4]))
    writer.close()
    assert wire.receive(reader) == ("call", 4, ("fence", ()))
    assert wire.receive(reader) is None
