"""A checkpoint's training state put back: rows and the best tracker written when epochs were counted
from 0 are counted from 1 on resume, as everything baton shows counts them."""
from __future__ import annotations

import torch

from baton.schemas.spec import JobSpec
from baton.storage.checkpoint_io import rows_of
from baton.storage.stores.file_store import FileStore
from baton.storage.manifest_store import ManifestStore
from baton.storage.layout import JobPaths
from baton.workers.training import train_state
from baton.workers.training.components import build_components
from tests.helpers import make_spec


def test_rows_and_the_best_from_a_checkpoint_counting_epochs_from_0_are_counted_from_1(run_job):
    spec = make_spec(loop={"epochs": 2})
    _, root, job = run_job(spec)
    latest = ManifestStore(FileStore(root), JobPaths(job)).read().latest
    state = torch.load(root / latest.key, weights_only=True)
    rows, best = rows_of(state["metrics"]), state["best"]
    assert [r["epoch"] for r in rows] == [1, 2] and best["epoch"] in (1, 2)

    older = {**state, "config": {k: v for k, v in state["config"].items() if k != "epochs_from"},
             "metrics": [{**r, "epoch": r["epoch"] - 1} for r in rows], "best": {**best, "epoch": best["epoch"] - 1}}
    parts = build_components(JobSpec.parse(spec), torch.device("cpu"), ("tests",), 0, 1)
    _, restored_best, restored_rows = train_state.restore(parts, older)
    assert restored_rows == rows and restored_best.epoch == best["epoch"]
    _, same_best, same_rows = train_state.restore(parts, state)
    assert same_rows == rows and same_best.epoch == best["epoch"]
