from __future__ import annotations

from pathlib import Path

import pytest

from baton.schemas.spec import JobSpec
from baton.storage.stores.file_store import FileStore
from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt
from baton.workers.training.control import LoopControl

from tests import probes
from tests.helpers import make_spec, run_reference

# ~0.1 s per optimizer step (slow data, as real data is): long enough to act mid-epoch
SPEC = make_spec(data={"target": "tests.probes:slow_spiral", "kwargs": {"n_per_class": 300, "delay_s": 0.003}},
                 loop={"epochs": 3}, checkpoint={"every_steps": 4, "keep_last": 3})
"""The job the end-to-end worker tests (loss, shutdown, Redis faults) train and compare."""


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """SPEC run uninterrupted (in this process, file store), once for every module that compares with it."""
    return run_reference(tmp_path_factory.mktemp("reference"), SPEC)


class Quiet(LoopControl):
    def log(self, message: str) -> None:
        pass


@pytest.fixture
def run_job(tmp_path):
    """Run a spec (a dict) in this process to the end; returns (result, store root, job id)."""
    counter = iter(range(1000))

    def run(spec: dict, job_id: str | None = None):
        job_id = job_id or f"job{next(counter)}"
        store = FileStore(tmp_path / "store")
        result = run_attempt(Attempt(JobSpec.parse(spec), job_id, 1, store, allowed_prefixes=("tests",)), AttemptOptions(Quiet()))
        return result, Path(store.root), job_id

    return run


@pytest.fixture(scope="session")
def ddp_reference(tmp_path_factory):
    """tests.workers.parallel.test_ddp.SPEC2 (2 ranks) run uninterrupted in this process (rank 0 here, rank 1 a
    child), job id ``reference``: shared by the data-parallel tests that resume it elsewhere."""
    from tests.workers.parallel.test_ddp import SPEC2

    store = FileStore(tmp_path_factory.mktemp("ddp-reference") / "store")
    result = run_attempt(Attempt(JobSpec.parse(SPEC2), "reference", 1, store, allowed_prefixes=("tests",)), AttemptOptions(Quiet()))
    assert result.outcome.completed
    return store


@pytest.fixture(autouse=True)
def clear_probes():
    probes.FORWARDS.clear()
    probes.GRAD_WAS_NONE.clear()
    yield


def read_rows(root: Path, job_id: str) -> list[dict]:
    from baton.storage.stores.file_store import FileStore

    from tests.helpers import metrics_rows

    return metrics_rows(FileStore(root), job_id)
