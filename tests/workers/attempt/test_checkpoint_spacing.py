"""``checkpoint.min_interval_s``: a loop of many short epochs checkpoints by time, not at every epoch,
and which checkpoints it skips changes no bit of its training; every validation's row is kept."""
from __future__ import annotations

import pytest

from baton.storage.artifacts import read_metrics
from baton.storage.checkpoint_io import load_bytes, rows_of
from baton.storage.layout import JobPaths
from baton.storage.manifest_store import ManifestStore
from baton.storage.stores.file_store import FileStore
from tests.helpers import assert_same_training, make_spec, metrics_rows, run_baton, start_baton, write_spec

# ~5 steps an epoch, a few milliseconds each: 40 epochs in well under a second of training
SHORT_EPOCHS = make_spec(data={"kwargs": {"n_per_class": 30}, "batch_size": 16}, loop={"epochs": 40},
                         checkpoint={"every_steps": 2, "keep_last": 3})


def _run(tmp_path, name: str, interval: float, resources: dict) -> FileStore:
    spec = {**SHORT_EPOCHS, "checkpoint": {**SHORT_EPOCHS["checkpoint"], "min_interval_s": interval},
            "resources": {**SHORT_EPOCHS["resources"], **resources}}
    store = FileStore(tmp_path / name)
    done = run_baton("run", str(write_spec(tmp_path, spec, f"{name}.yaml")), "--id", "j", "--storage", store.url,
                     "--no-progress")
    assert done.returncode == 0, done.stdout + done.stderr
    return store


@pytest.mark.parametrize("resources", [{}, {"processes": 2}, {"processes": 2, "strategy": "fsdp"}],
                         ids=["one-process", "ddp", "fsdp"])
@pytest.mark.slow
def test_short_epochs_are_checkpointed_by_time_and_the_training_is_the_same(tmp_path, resources):
    """With 2 ranks, every rank must skip the same checkpoints (they agree in a collective), or the
    run would hang in its next gather."""
    spaced, every = _run(tmp_path, "spaced", 3600.0, resources), _run(tmp_path, "every", 0.0, resources)
    if resources.get("strategy") == "fsdp":  # (its checkpoints are directories of shards)
        from tests.workers.parallel.test_fsdp import assert_same_sharded_training
        assert_same_sharded_training(spaced, "j", every, "j", tmp_path)
    else:
        assert_same_training(spaced, "j", every, "j")  # final state torch.equal, the same losses
    rows, all_rows = metrics_rows(spaced, "j"), metrics_rows(every, "j")
    assert [row["epoch"] for row in rows] == [row["epoch"] for row in all_rows] == list(range(1, 41))
    assert all(row["checkpoint"] for row in all_rows)
    skipped = [row["epoch"] for row in rows if row["checkpoint"] is None]
    assert skipped and rows[-1]["checkpoint"], skipped  # (the run's end is always checkpointed)
    # only a new best is checkpointed within the interval (the first checkpoint starts it)
    assert all(row["is_best"] for row in rows[1:] if row["checkpoint"] and row["epoch"] < 40), rows
    assert rows[-1]["ckpt_skipped"] >= len(skipped)


@pytest.mark.slow
def test_every_committed_checkpoint_has_its_rows_in_metrics_jsonl(tmp_path):
    """The rows of validations whose checkpoint was skipped go with the next checkpoint taken, a periodic
    one included: at every commit, metrics.jsonl holds every row the latest checkpoint's state holds (a
    job lost right after it resumes past those validations and never writes them again)."""
    spec = {**SHORT_EPOCHS, "loop": {**SHORT_EPOCHS["loop"], "epochs": 60},
            "checkpoint": {**SHORT_EPOCHS["checkpoint"], "min_interval_s": 0.05, "keep_last": 1000}}
    store = FileStore(tmp_path / "store")
    proc = start_baton("run", str(write_spec(tmp_path, spec)), "--id", "j", "--storage", store.url, "--no-progress",
                       log=tmp_path / "run.log")
    seen, lagging = 0, []
    while proc.poll() is None or not seen:
        manifest = ManifestStore(store, JobPaths("j")).read()
        if manifest is None or not manifest.checkpoints or manifest.checkpoints[-1].files is not None:
            continue
        latest = manifest.checkpoints[-1]
        try:
            held = rows_of(load_bytes(store.get_bytes(latest.key))["metrics"])
            published = read_metrics(store, manifest)
        except FileNotFoundError:  # (a later commit replaced that metrics.jsonl meanwhile: read the next manifest)
            continue
        seen += 1
        if len(published) < len(held):
            lagging.append((latest.kind, latest.step, len(published), len(held)))
    assert proc.wait() == 0, (tmp_path / "run.log").read_text()
    assert seen > 5 and not lagging, (seen, lagging)
