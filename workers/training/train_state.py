"""A checkpoint's contents: the full training state, and putting it back.

Top-level keys: format, model, optimizer, scheduler, scaler, rng, progress, data, best, metrics,
config. Everything is a tensor or a plain value, loadable with ``weights_only=True``. ``data`` is
the loader's state for a stream (its data set's ``state_dict()`` included) and None for
map-style data, whose position is ``progress``'s (epoch, batch_in_epoch).
"""
from __future__ import annotations

from typing import Any

import torch

from baton.storage.checkpoint_io import FORMAT_VERSION, rows_of
from baton.storage.checkpointing.plain import Plain
from baton.storage.checkpointing.snapshot import storage_key

from baton.workers.training import rng
from baton.workers.training.components import Components
from baton.workers.training.progress import BestTracker, Progress


def capture(parts: Components, progress: Progress, best: BestTracker, metrics: list[dict], cpu_threads: int,
            weights: bool = True) -> dict[str, Any]:
    """The live state (tensors are references: snapshot it before the loop moves on). The metrics
    rows are wrapped in ``Plain``: the snapshot does not walk them (``baton.storage.checkpointing.snapshot.unwrap``).
    Without ``weights``, all but the model and the optimizer (a sharded checkpointer takes those as
    shards: building their whole state dicts here would only add to the stall)."""
    state = {"model": parts.model.state_dict(), "optimizer": parts.optimizer.state_dict()} if weights else {}
    return {
        "format": FORMAT_VERSION,
        **state,
        "scheduler": parts.scheduler.state_dict() if parts.scheduler is not None else None,
        "scaler": parts.scaler.state_dict() if parts.scaler.is_enabled() else None,
        "rng": rng.capture(parts.device),
        "progress": progress.state_dict(),
        "data": parts.data.state_dict(),
        "best": best.state_dict(),
        "metrics": Plain(list(metrics)),  # rows are never modified once appended
        "config": {"cpu_threads": cpu_threads, "device_type": parts.device.type, "epochs_from": 1,
                   "run_steps": parts.run_steps, "schedule_steps": parts.schedule_total},
    }


def stable_storages(parts: Components) -> set[int]:
    """Storage keys of the tensors that only ``optimizer.step`` modifies (the parameters and the
    optimizer's state): a snapshot may copy them while the next forward and backward run."""
    keys = {storage_key(p) for p in parts.model.parameters()}
    for per_param in parts.optimizer.state.values():
        keys.update(storage_key(v) for v in per_param.values() if isinstance(v, torch.Tensor))
    return keys


def restore(parts: Components, state: dict[str, Any]) -> tuple[Progress, BestTracker, list[dict]]:
    """Load ``state`` into ``parts`` (RNG last, after anything that might draw from it)."""
    parts.model.load_state_dict(state["model"])
    parts.optimizer.load_state_dict(state["optimizer"])
    return restore_loop_state(parts, state)


def restore_loop_state(parts: Components, state: dict[str, Any]) -> tuple[Progress, BestTracker, list[dict]]:
    """Everything but the model and the optimizer (a sharded job loads those from its shards)."""
    config = state["config"]
    saved_length = config.get("schedule_steps")  # differs after a resharded resume refit the schedule
    if (parts.scheduler is not None and parts.spec.scheduler.per_step and saved_length is not None
            and saved_length != parts.schedule_total):
        parts.rebuild_schedule(saved_length)
    parts.run_steps = config.get("run_steps")
    if parts.scheduler is not None:
        parts.scheduler.load_state_dict(state["scheduler"])
    if parts.scaler.is_enabled():
        parts.scaler.load_state_dict(state["scaler"])
    parts.data.load_state_dict(state.get("data"))
    rng.restore(state["rng"], parts.device)
    best, rows = BestTracker.from_state(state["best"]), rows_of(state["metrics"])
    if config.get("epochs_from") != 1:  # written before rows and the best counted epochs from 1
        rows = [{**row, "epoch": row["epoch"] + 1} for row in rows]
        best.epoch = None if best.epoch is None else best.epoch + 1
    return Progress.from_state(state["progress"]), best, rows
