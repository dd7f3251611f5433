"""The end of a job: weights for consumers, the report, the curves, then ``completed``.

Written in this order so that ``completed: true`` in the manifest means every artifact exists.
A crash in between is harmless: the next attempt resumes from the final checkpoint, trains no
further, and writes them again.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Callable

import safetensors.torch
from torch import nn

from schemas.manifest import CheckpointManifest
from storage.base import ObjectStore
from storage.layout import JobPaths
from storage.manifest_store import ManifestStore
from storage.retry import retry_transient

from .curves import plot_curves
from .report import build_report

WRITE_RETRY_S = 300.0
"""How long writing a final artifact is retried through transient storage errors."""


def export_weights(model: nn.Module) -> bytes:
    """The model's state_dict as safetensors (shared tensors are written once)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        safetensors.torch.save_model(model, str(path))
        return path.read_bytes()


def finalize(store: ObjectStore, paths: JobPaths, attempt: int, spec: dict, model: nn.Module,
             rows: list[dict], best: dict, fence: Callable[[], None], log: Callable[[str], None]) -> dict:
    def put(key: str, data: bytes) -> None:
        retry_transient(lambda: store.put_bytes(key, data), WRITE_RETRY_S, f"write {key}", log)

    report = build_report(paths.job_id, spec, rows, best, resumed_attempts=attempt)
    fence()
    put(paths.final_model, export_weights(model))
    put(paths.report, json.dumps(report, indent=2).encode())
    put(paths.curves, plot_curves(rows, best["step"], f"{spec.get('name')} ({paths.job_id})"))

    def complete(manifest: CheckpointManifest) -> None:
        manifest.completed = True

    retry_transient(lambda: ManifestStore(store, paths).update(attempt, complete), WRITE_RETRY_S, "complete manifest", log)
    return report
