"""A best checkpoint that is corrupt or gone by the time the job finishes: the job still succeeds,
best.safetensors holds the best committed checkpoint that verifies (or is absent), and the report
says which, and why."""
from __future__ import annotations

import pytest

import json
import math
import os
import signal
import time
from pathlib import Path
from typing import Optional

import safetensors.torch
import torch

from baton.schemas.manifest import CheckpointManifest
from baton.schemas.spec import JobSpec
from baton.storage.checkpoint_io import load_bytes
from baton.storage.stores.file_store import FileStore
from baton.storage.layout import JobPaths
from baton.workers.attempt.local import register_spec
from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt
from baton.workers.training.control import LoopControl, StepReport

from tests.helpers import make_spec, read_manifest, run_baton, start_baton, write_spec

# validation loss rises epoch after epoch, so the best checkpoint is the first epoch's, committed
# long before the end; no periodic checkpoints, and every validation checkpointed (min_interval_s 0: none of
# them a new best, they would be spaced), so every committed one has a validation at its step.
# Loading is paced (2 ms a sample): a `baton run` polled for its SIGTERM must not end between two polls
SPEC = make_spec(data={"target": "tests.probes:diverging", "kwargs": {"delay_s": 0.002}, "batch_size": 16,
                       "val_fraction": 0.25},
                 loop={"epochs": 4}, checkpoint={"every_steps": None, "keep_last": 3, "min_interval_s": 0})
STEPS_PER_EPOCH = 10  # 150 training samples in batches of 16


class StopAt(LoopControl):
    """Stops (as a preemption does: a checkpoint, then out) after optimizer step ``step``."""

    def __init__(self, step: int):
        self.at, self.step, self.lines = step, 0, []

    def on_step(self, report: StepReport) -> None:
        self.step = report.step

    def stop_reason(self) -> Optional[str]:
        return "preempted" if self.step >= self.at else None

    def log(self, message: str) -> None:
        self.lines.append(message)


def _attempt(store: FileStore, job: str, attempt: int, control: LoopControl):
    return run_attempt(Attempt(JobSpec.parse(SPEC), job, attempt, store, allowed_prefixes=("tests",)), AttemptOptions(control))


def _stopped_with_an_older_best(store: FileStore, job: str) -> CheckpointManifest:
    """Attempt 1 trains into epoch 2 and stops there: the best (epoch 1) is committed and is not the latest."""
    register_spec(store, JobPaths(job), JobSpec.parse(SPEC))
    result = _attempt(store, job, 1, StopAt(STEPS_PER_EPOCH + 3))
    assert not result.outcome.completed
    manifest = CheckpointManifest.model_validate(read_manifest(store, job))
    assert manifest.best is not None and manifest.best.step == STEPS_PER_EPOCH
    assert manifest.latest.key != manifest.best.key
    return manifest


def _finished(store: FileStore, job: str) -> tuple[CheckpointManifest, dict]:
    manifest = CheckpointManifest.model_validate(read_manifest(store, job))
    assert manifest.completed and manifest.final is not None
    report = json.loads(store.get_bytes(manifest.final.report.key))
    return manifest, report


def _best_verified(store: FileStore, manifest: CheckpointManifest, broken: str):
    """The committed checkpoint (other than ``broken``) with the lowest validation loss at its step."""
    rows = [json.loads(line) for line in store.get_bytes(manifest.metrics.key).decode().splitlines() if line]
    loss_at = {row["step"]: row["val_loss"] for row in rows}
    known = [e for e in manifest.checkpoints if e.key != broken and math.isfinite(loss_at.get(e.step, math.nan))]
    assert len(known) >= 2, "the test needs a choice among verified checkpoints"
    return min(known, key=lambda e: (loss_at[e.step], e.step)), loss_at


def _assert_best_weights_from(store: FileStore, manifest: CheckpointManifest, key: str) -> None:
    """best.safetensors holds exactly the model state of checkpoint ``key``, every tensor torch.equal."""
    assert manifest.final.best_model is not None
    exported = safetensors.torch.load(store.get_bytes(manifest.final.best_model.key))
    model = load_bytes(store.get_bytes(key))["model"]
    assert exported.keys() == model.keys()
    for name, tensor in model.items():
        assert torch.equal(exported[name], tensor), name


def _overwrite(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = os.urandom(64)  # same size: only the sha256 can tell
    path.write_bytes(bytes(data))


def test_a_corrupt_best_checkpoint_finishes_with_the_best_one_that_verifies(tmp_path):
    store = FileStore(tmp_path / "store")
    stopped = _stopped_with_an_older_best(store, "corrupt-best")
    broken = stopped.best.key
    _overwrite(Path(store.root) / broken)

    control = StopAt(10**9)
    result = _attempt(store, "corrupt-best", 2, control)  # resumes from the latest (intact), trains on, finishes

    assert result.outcome.completed
    manifest, report = _finished(store, "corrupt-best")
    chosen, loss_at = _best_verified(store, manifest, broken)
    _assert_best_weights_from(store, manifest, chosen.key)
    best = report["best"]
    assert best["checkpoint"] == broken and best["step"] == STEPS_PER_EPOCH  # the best validation is still named
    assert best["weights"] == chosen.key
    assert best["weights_note"].startswith(f"best checkpoint {broken} failed verification (sha256 does not match")
    assert f"best.safetensors holds {chosen.key} (step {chosen.step}, val_loss = {loss_at[chosen.step]:.6g})" \
        in best["weights_note"]
    assert f"best weights: {best['weights_note']}" in report["note"]
    assert any(best["weights_note"] in line for line in control.lines), control.lines


def test_with_no_checkpoint_that_verifies_the_job_finishes_without_best_weights(tmp_path):
    """The best checkpoint is corrupt, and so is every checkpoint the finishing attempt commits (each
    overwritten as soon as it is committed): the job succeeds with model.safetensors and no best.safetensors."""
    store = FileStore(tmp_path / "store")
    stopped = _stopped_with_an_older_best(store, "none-verify")
    broken = stopped.best.key
    _overwrite(Path(store.root) / broken)
    overwritten: list[str] = []

    def overwrite_new(manifest: CheckpointManifest, stats) -> None:  # runs after each commit, before the finish
        for entry in manifest.checkpoints:
            if entry.attempt == 2 and entry.key not in overwritten:
                _overwrite(Path(store.root) / entry.key)
                overwritten.append(entry.key)

    result = run_attempt(Attempt(JobSpec.parse(SPEC), "none-verify", 2, store, allowed_prefixes=("tests",)), AttemptOptions(StopAt(10**9), on_commit=overwrite_new))

    assert result.outcome.completed and len(overwritten) == 3  # epochs 2, 3 and 4 ended with a checkpoint
    manifest, report = _finished(store, "none-verify")
    assert manifest.final.best_model is None and manifest.final.model is not None
    best = report["best"]
    assert best["checkpoint"] == broken and best["weights"] is None
    assert best["weights_note"].startswith(f"best checkpoint {broken} failed verification")
    for key in overwritten:
        assert f"{key} failed verification" in best["weights_note"]
    assert best["weights_note"].endswith("so there is no best.safetensors")


def _sigterm_when(proc, store: FileStore, job: str, timeout: float = 120) -> None:
    """SIGTERM ``proc`` (``baton run``: it checkpoints and exits 3) once its best checkpoint is an
    older one than its latest."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the job ended (rc {proc.returncode}) before it could be stopped"
        manifest = read_manifest(store, job)
        if manifest and manifest["best"] and manifest["checkpoints"][-1]["step"] > manifest["best"]["step"]:
            os.killpg(proc.pid, signal.SIGTERM)
            assert proc.wait(timeout=120) == 3
            return
        time.sleep(0.005)
    proc.kill()
    raise AssertionError("no checkpoint after the best one was committed")


@pytest.mark.slow
def test_a_deleted_best_checkpoint_lets_baton_run_finish_and_say_so(tmp_path):
    """`baton run`, stopped by SIGTERM after its best checkpoint; the best object is deleted from the
    file store, and the same --id finishes the job: exit 0, the note printed."""
    store = FileStore(tmp_path / "store")
    spec_path = write_spec(tmp_path, SPEC)
    proc = start_baton("run", str(spec_path), "--id", "gone", "--storage", store.url, log=tmp_path / "first.log")
    _sigterm_when(proc, store, "gone")
    broken = read_manifest(store, "gone")["best"]["key"]
    (Path(store.root) / broken).unlink()

    finished = run_baton("run", str(spec_path), "--id", "gone", "--storage", store.url)

    assert finished.returncode == 0, finished.stdout + finished.stderr
    manifest, report = _finished(store, "gone")
    chosen, _ = _best_verified(store, manifest, broken)
    _assert_best_weights_from(store, manifest, chosen.key)
    best = report["best"]
    assert best["checkpoint"] == broken and best["weights"] == chosen.key
    assert best["weights_note"].startswith(f"best checkpoint {broken} is missing; best.safetensors holds {chosen.key}")
    assert f"best weights: {best['weights_note']}" in finished.stdout
