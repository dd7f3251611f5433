"""Which steps a job's earlier attempts already wrote to TensorBoard, read from their event files.

An attempt's own bookkeeping cannot say it: a row committed by a killed attempt may never have
reached that attempt's event file (it was killed between the commit and the upload), and an attempt
resumed from an older checkpoint (its predecessor's latest was corrupt) trains again rows that an
earlier event file already holds. So the next attempt reads the files themselves, as MLflow's
tracker asks the run for the steps it holds.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from baton.storage.stores.base import ObjectStore
from baton.storage.layout import JobPaths

EVENT_FILE_PREFIX = "events.out.tfevents."


def steps_written_before(store: ObjectStore, paths: JobPaths, scratch: Path) -> set[int]:
    """Every step of a scalar in the event files of the attempts before ``paths.attempt``; the files
    are downloaded into ``scratch`` (a directory of this attempt's own) and removed after."""
    steps: set[int] = set()
    for attempt in range(1, paths.attempt or 1):
        prefix = paths.for_attempt(attempt).tensorboard + "/"
        keys = [key for key in store.list(prefix) if key[len(prefix):].startswith(EVENT_FILE_PREFIX)]
        if not keys:
            continue
        directory = scratch / f"attempt-{attempt}"
        directory.mkdir(parents=True, exist_ok=True)
        try:
            for key in keys:
                store.get_file(key, directory / key[len(prefix):])
            steps |= scalar_steps(directory)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    return steps


def scalar_steps(directory: Path) -> set[int]:
    """The steps of every scalar in the event files of ``directory`` (TensorBoard's own reader;
    nothing purged, so a file whose steps restart is read whole)."""
    from tensorboard.backend.event_processing import event_accumulator  # optional: baton[tensorboard]

    reader = event_accumulator.EventAccumulator(str(directory), purge_orphaned_data=False,
                                                size_guidance={event_accumulator.SCALARS: 0})
    reader.Reload()
    return {event.step for tag in reader.Tags()["scalars"] for event in reader.Scalars(tag)}
