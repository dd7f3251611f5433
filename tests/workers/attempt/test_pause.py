"""A job paused at a validation (``pause_at``: a search's rung) stops there with that validation's
checkpoint committed; continued, it redoes no step (counted by the user's own model) and ends bit-equal
to a run never paused. Attempts run in this process, as a worker's training process runs them."""
from __future__ import annotations

from typing import Optional

import pytest

from baton.schemas.messages import Outcome
from baton.schemas.spec import JobSpec
from baton.storage.layout import JobPaths
from baton.storage.stores.file_store import FileStore
from baton.workers.attempt.local import register_spec
from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt
from baton.workers.training.control import LoopControl

from tests.helpers import assert_same_training, committed_manifest, make_spec, metrics_rows, run_reference
from tests.probes import forwards_counted

# 720 training samples in batches of 32: 23 steps an epoch; validations at steps 10, 20, 23 (the end of
# epoch 1), 30, 40, 46, 50, 60, 69
STEPS_PER_EPOCH = 23


class Quiet(LoopControl):
    def log(self, message: str) -> None:
        pass


def spec_counted(directory, **loop) -> dict:
    return make_spec(model={"target": "tests.probes:counting_mlp",
                            "kwargs": {"directory": str(directory), "in_features": 2, "hidden": 32,
                                       "out_features": 3}},
                     loop={"epochs": 3, "eval_every_steps": 10, **loop}, checkpoint={"every_steps": 4})


def stepped(directory) -> dict:
    """The same, step-based: 69 steps, validations every 10 and at the end."""
    spec = spec_counted(directory, max_steps=3 * STEPS_PER_EPOCH)
    spec["loop"].pop("epochs")
    return spec


class Attempts:
    """A job's attempts, one after another, in one store."""

    def __init__(self, store: FileStore, spec: dict, job_id: str = "paused"):
        self.store, self.spec, self.job_id, self.number = store, JobSpec.parse(spec), job_id, 0
        register_spec(store, JobPaths(job_id), self.spec)

    def run(self, pause_at: Optional[int]) -> Outcome:
        self.number += 1
        attempt = Attempt(self.spec, self.job_id, self.number, self.store, ("tests",), pause_at=pause_at)
        return run_attempt(attempt, AttemptOptions(Quiet())).outcome


def reference_of(tmp_path_factory, make) -> tuple:
    root = tmp_path_factory.mktemp("reference")
    (root / "forwards").mkdir()
    store = run_reference(root / "run", make(root / "forwards"))
    return store, sum(forwards_counted(str(root / "forwards")).values())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return reference_of(tmp_path_factory, spec_counted)


def forwards(tmp_path) -> int:
    return sum(forwards_counted(str(tmp_path / "forwards")).values())


def test_an_epoch_run_paused_at_epoch_ends_then_continued_ends_bit_equal_redoing_no_step(tmp_path, reference):
    (tmp_path / "forwards").mkdir()
    job = Attempts(FileStore(tmp_path / "store"), spec_counted(tmp_path / "forwards"))

    first = job.run(pause_at=1)  # past the validations at steps 10 and 20: at the end of epoch 1
    assert (first.completed, first.reason, first.step) == (False, "paused", STEPS_PER_EPOCH)
    manifest = committed_manifest(job.store, job.job_id)
    assert manifest.latest is not None and manifest.latest.step == STEPS_PER_EPOCH
    assert [row["step"] for row in metrics_rows(job.store, job.job_id)] == [10, 20, 23]  # the rung's metric, committed

    again = job.run(pause_at=1)  # an attempt lost before its pause was recorded: it pauses at once
    assert (again.reason, again.step) == ("paused", STEPS_PER_EPOCH)
    assert forwards(tmp_path) == STEPS_PER_EPOCH  # no step trained twice

    second = job.run(pause_at=2)
    assert (second.reason, second.step) == ("paused", 2 * STEPS_PER_EPOCH)
    assert job.run(pause_at=3).completed  # a pause at the run's end is its end

    store, reference_forwards = reference
    assert_same_training(store, "reference", job.store, job.job_id)
    assert forwards(tmp_path) == reference_forwards


def test_a_step_run_pauses_at_the_first_validation_at_or_past_its_step(tmp_path_factory, tmp_path):
    (tmp_path / "forwards").mkdir()
    job = Attempts(FileStore(tmp_path / "store"), stepped(tmp_path / "forwards"))
    assert (job.run(pause_at=7).step, job.run(pause_at=10).step, job.run(pause_at=21).step) == (10, 10, 30)
    assert job.run(pause_at=None).completed
    store, reference_forwards = reference_of(tmp_path_factory, stepped)
    assert_same_training(store, "reference", job.store, job.job_id)
    assert forwards(tmp_path) == reference_forwards
