"""The end of a job: weights for consumers (the last and the best), the report, the curves, then
``completed``.

The artifacts are written under this attempt's own keys, then the fenced manifest
compare-and-swap that sets ``completed`` refers to them (``final``): readers find them only
through it, so ``completed: true`` means every artifact exists, and an attempt fenced out
meanwhile overwrites nothing a reader can reach. A crash in between is harmless: the next attempt
resumes from the final checkpoint, trains no further, and writes its own. A best checkpoint that
is corrupt or gone by then does not fail the job: ``best_weights.py`` picks the weights instead.
"""
from __future__ import annotations

import json
from typing import Optional

import safetensors.torch
import torch
from torch import nn

from baton.schemas.errors import FencedOut
from baton.schemas.manifest import CheckpointManifest, FinalArtifacts, ObjectRef
from baton.storage.checkpointing.contract import CheckpointTarget
from baton.storage.checkpoint_io import sha256_of
from baton.storage.manifest_store import ManifestStore
from baton.storage.stores.retry import retry_transient
from baton.storage.rotation import collect_garbage
from baton.workers.tracking.curves import plot_curves
from baton.workers.tracking.report import Provenance, build_report

from baton.workers.attempt.best_weights import choose_best_weights, read_model

WRITE_RETRY_S = 300.0
"""How long writing a final artifact is retried through transient storage errors."""


def export_weights(model: nn.Module) -> bytes:
    """The model's whole state_dict as safetensors: every key, so that ``model.load_state_dict(
    safetensors.torch.load_file(path))`` loads it strictly."""
    return export_state(model.state_dict())


def export_state(state: dict[str, torch.Tensor]) -> bytes:
    """A model's state_dict as safetensors. Tensors that share memory (tied weights: a language
    model's head and its token embedding) are written under each of their names, a copy each after
    the first (safetensors refuses shared memory; ``save_model`` keeps only one name)."""
    tensors, written = {}, set()
    for name, tensor in state.items():
        tensor = tensor.detach().cpu()
        storage = (tensor.untyped_storage().data_ptr(), tensor.device)
        tensors[name] = tensor.clone(memory_format=torch.contiguous_format) if storage in written else tensor.contiguous()
        written.add(storage)
    return safetensors.torch.save(tensors)


def finalize(target: CheckpointTarget, spec: dict, model: Optional[nn.Module], rows: list[dict], best: dict) -> dict:
    """The final artifacts of ``target``'s attempt, and the manifest's completion. ``model``: the trained
    model; None where a checkpointer took the weights as shards (a sharded job): the last weights are then
    assembled from its final checkpoint's shards (on this process's host, once)."""
    store, paths, attempt, fence, log = target.store, target.paths, target.attempt, target.fence, target.log
    own = target.attempt_paths

    def put(key: str, data: bytes) -> ObjectRef:
        retry_transient(lambda: store.put_bytes(key, data), WRITE_RETRY_S, f"write {key}", log)
        return ObjectRef(key=key, size=len(data), sha256=sha256_of(data))

    current = ManifestStore(store, paths).read()
    if current.attempt > attempt:  # the commit below would be refused: write nothing at all
        raise FencedOut(f"job {paths.job_id}: attempt {current.attempt} owns it; attempt {attempt} writes no final artifacts")
    chosen = choose_best_weights(store, current, rows, best["mode"], log)  # never fails the finished job
    report = build_report(paths.job_id, spec, rows, best, Provenance(
        attempts=attempt, best_key=current.best.key if current.best is not None else None,
        weights_key=chosen.entry.key if chosen.entry is not None else None, weights_note=chosen.note,
        reshards=tuple(r.describe() for r in current.reshards)))
    fence()
    best_weights = None
    if model is not None:
        last_weights = export_weights(model)
        if chosen.model is not None:  # the training is over: the live model may take the best weights now
            model.load_state_dict(chosen.model)
            best_weights = put(own.best_model, export_weights(model))
    else:  # one whole model in memory at a time (and its bytes): the best, then the last unless the same
        best_bytes = export_state(chosen.model) if chosen.model is not None else None
        latest = current.latest
        assert latest is not None  # a finished run has committed its last checkpoint
        same = chosen.entry is not None and chosen.entry.key == latest.key
        chosen.model = None
        if best_bytes is not None:
            best_weights = put(own.best_model, best_bytes)
        last_weights = best_bytes if same and best_bytes is not None else export_state(read_model(store, latest, log))
        del best_bytes
    final = FinalArtifacts(
        attempt=attempt,
        model=put(own.final_model, last_weights),
        best_model=best_weights,
        report=put(own.report, json.dumps(report, indent=2).encode()),
        curves=put(own.curves, plot_curves(rows, best["step"], f"{spec.get('name')} ({paths.job_id})")),
    )

    def complete(manifest: CheckpointManifest) -> None:
        manifest.completed = True
        manifest.final = final

    fence()
    manifest = retry_transient(lambda: ManifestStore(store, paths).update(attempt, complete), WRITE_RETRY_S,
                               "complete manifest", log)
    collect_garbage(store, own, manifest, attempt, log)
    return report
