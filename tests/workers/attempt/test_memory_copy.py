"""The last step in memory (storage/memory/memory_copy.py), in one process: copies taken while training, a
resume from the newest one that verifies, bit-exact with a run never interrupted."""
from __future__ import annotations

import os
import time

import pytest

from baton.schemas.spec import JobSpec
from baton.storage.memory import memory_slots
from baton.storage.stores.file_store import FileStore
from baton.storage.layout import JobPaths
from baton.workers.attempt.local import register_spec
from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt
from baton.workers.training.control import LoopControl
from tests.helpers import assert_same_training, make_spec, read_manifest, run_reference

SPEC = make_spec(loop={"epochs": 2, "grad_accum_steps": 2}, checkpoint={"every_steps": 8, "memory_every_steps": 1})


class Crash(BaseException):
    """Stands for the training process dying: nothing after it runs in the attempt."""


class CrashAt(LoopControl):
    """Crashes at ``step``, once the durable checkpoint of step ``committed`` is in ``store`` (a copy that
    follows a validation is used only once that validation's checkpoint is committed)."""

    def __init__(self, step: int, store=None, committed: int = 0):
        self.step, self.store, self.committed, self.lines = step, store, committed, []

    def on_step(self, report) -> None:
        if report.step == self.step:
            deadline = time.monotonic() + 30
            while (read_manifest(self.store, "cut") or {"checkpoints": [{"step": -1}]})["checkpoints"][-1]["step"] < self.committed:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            raise Crash(self.step)

    def log(self, message: str) -> None:
        self.lines.append(message)


@pytest.fixture
def dirs(tmp_path):
    made = [tmp_path / "shm", tmp_path / "disk"]
    for d in made:
        d.mkdir()
    return made


def _attempt(store, attempt, control, dirs):
    return run_attempt(Attempt(JobSpec.parse(SPEC), "cut", attempt, store, allowed_prefixes=("tests",)), AttemptOptions(control, memory=tuple([str(d) for d in dirs])))


def test_copies_taken_while_training_resume_bit_exact(tmp_path, dirs):
    reference = run_reference(tmp_path / "ref", SPEC)
    store = FileStore(tmp_path / "store")
    register_spec(store, JobPaths("cut"), JobSpec.parse(SPEC))
    crash = CrashAt(15, store, committed=12)  # 12 steps an epoch; between durable checkpoints (epoch 1's at 12, and 16)
    with pytest.raises(Crash):
        _attempt(store, 1, crash, dirs)
    copy = memory_slots.newest(dirs)
    assert copy is not None and copy.step == 14  # the copy after step 15 was never taken

    resumed = CrashAt(-1)
    result = _attempt(store, 2, resumed, dirs)
    assert result.outcome.completed and result.resumed_from_step == 14, resumed.lines
    assert any("resuming from the in-memory copy of step 14" in line for line in resumed.lines), resumed.lines
    assert_same_training(reference, "reference", store, "cut")


def test_a_copy_that_does_not_verify_falls_back_to_the_one_before(tmp_path, dirs):
    store = FileStore(tmp_path / "store")
    register_spec(store, JobPaths("cut"), JobSpec.parse(SPEC))
    with pytest.raises(Crash):
        _attempt(store, 1, CrashAt(15, store, committed=12), dirs)
    newest = memory_slots.newest(dirs)
    # a bit flipped in the newest copy's largest buffer
    record = memory_slots.read_record(memory_slots.record_path(dirs, newest.slot))
    path = max(record.digests, key=os.path.getsize)
    data = bytearray(open(path, "rb").read())
    data[0] ^= 1
    open(path, "wb").write(bytes(data))
    lines = []
    older = memory_slots.newest(dirs, lines.append)
    assert older is not None and older.step == 13 and "does not match its digest" in lines[0]
    # discarded: the next copy goes into its slot, never first over the copy just resumed from
    assert memory_slots.read_record(memory_slots.record_path(dirs, newest.slot)) is None


def test_the_interval_is_said_once_it_settles_not_at_every_noisy_choice(dirs):
    """The costs a loaded machine measures make the chosen interval wander (1, 2, 5, 1, 2, 4 ...): the
    log says an interval when it has held, and again only when it settles twice as far or more."""
    from baton.storage.memory.memory_copy import SETTLED_AFTER, MemoryCopier

    said = []
    copier = MemoryCopier(dirs, log=said.append)
    copier._step_s = 0.010  # a step of 10 ms: a copy of c ms gives an interval of ceil(c / 0.3)

    def measured(*intervals: int) -> None:
        for every in intervals:
            copier._cost_s = None  # (no smoothing: each measurement chooses ``every`` exactly)
            copier._update_interval(every * 0.0003, 0.0)
            assert copier.stats.every == every

    measured(1, 2, 5, 1, 2, 4, 1, 2, 5, 2)
    assert said == []
    measured(*[2] * SETTLED_AFTER)
    assert [line.split(":")[0] for line in said] == ["in-memory copies every 2 step(s)"]
    measured(*[3] * SETTLED_AFTER, 4, 2, 3)  # within twice the interval said: not news
    assert len(said) == 1
    measured(*[9] * (SETTLED_AFTER + 3))
    assert [line.split(":")[0] for line in said] == ["in-memory copies every 2 step(s)", "in-memory copies every 9 step(s)"]
