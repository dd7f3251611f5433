"""The commit protocol: manifests fence stale attempts, checkpoints appear only once verified,
rotation never deletes what a resume needs, a corrupt latest falls back to the one before."""
from __future__ import annotations

import threading

import pytest
import torch

from baton.schemas.errors import FencedOut, ManifestAhead
from baton.schemas.manifest import BestEntry, CheckpointEntry, CheckpointManifest
from baton.storage.artifacts import read_metrics
from baton.storage.checkpoint_io import load_bytes
from baton.storage.checkpointing.contract import CheckpointTarget
from baton.storage.checkpointing.checkpointer import AsyncCheckpointer
from baton.storage.checkpointing.contract import CheckpointRequest
from baton.storage.stores.file_store import FileStore
from baton.storage.layout import JobPaths
from baton.storage.manifest_store import ManifestStore
from baton.storage.rotation import rotate
from baton.workers.attempt.resume import load_latest_good, pin_resume_point

PATHS = JobPaths("job")
A1 = PATHS.for_attempt(1)  # the keys attempt 1 writes


def _state(step: int) -> dict:
    return {"format": 1, "model": {"w": torch.full((64,), float(step))}, "progress": {"global_step": step}}


def _request(step: int, kind: str = "step", **extra) -> CheckpointRequest:
    return CheckpointRequest(step=step, epoch=0, batch_in_epoch=step, kind=kind, **extra)


def _checkpointer(store, attempt: int = 1, keep_last: int = 2, **kw) -> AsyncCheckpointer:
    return AsyncCheckpointer(CheckpointTarget(store, PATHS, attempt, keep_last, log=lambda m: None), **kw)


def test_a_newer_attempt_fences_out_an_older_one(store):
    manifests = ManifestStore(store, PATHS)
    manifests.update(1, lambda m: None)
    manifests.update(2, lambda m: None)
    with pytest.raises(FencedOut):
        manifests.update(1, lambda m: None)
    assert manifests.read().attempt == 2


def test_two_claims_of_one_attempt_number_only_the_first_commits(store):
    """Redis lost a claim (or came back behind the store), so two workers hold attempt 3: the
    manifest's fencing token carries each claim's nonce, and the second claim is fenced out before
    it writes anything; the first one's checkpoints commit."""
    manifests = ManifestStore(store, PATHS)
    manifests.update(2, lambda m: None, claim="c2")
    first = manifests.update(3, lambda m: None, claim="a")
    assert (first.attempt, first.claim) == (3, "a")
    with pytest.raises(ManifestAhead) as fenced:
        manifests.update(3, lambda m: None, claim="b")
    assert fenced.value.current == 3
    assert manifests.update(3, lambda m: None, claim="a").claim == "a"  # its own claim again: fine

    ckpt = _checkpointer(store, attempt=3)  # the first claim's commits (no nonce needed after its claim)
    ckpt.save(lambda: _state(5), _request(5), mandatory=True)
    ckpt.close()
    after = manifests.read()
    assert [(e.step, e.attempt) for e in after.checkpoints] == [(5, 3)] and after.claim == "a"
    with pytest.raises(ManifestAhead):
        manifests.update(3, lambda m: None, claim="b")
    newer = manifests.update(4, lambda m: None)  # a newer attempt: the old nonce goes with the old attempt
    assert (newer.attempt, newer.claim) == (4, None)


def test_checkpoint_is_listed_only_after_its_verified_upload(store):
    ckpt = _checkpointer(store)
    ckpt.save(lambda: _state(5), _request(5), mandatory=True)
    ckpt.close()
    entry = ManifestStore(store, PATHS).read().latest
    data = store.get_bytes(entry.key)
    assert entry.key == A1.checkpoint(5) and entry.size == len(data)
    state = load_bytes(data, entry.sha256)
    assert torch.equal(state["model"]["w"], torch.full((64,), 5.0))


def test_the_snapshot_is_taken_before_save_returns(store):
    live = _state(1)
    ckpt = _checkpointer(store)
    ckpt.save(lambda: live, _request(1), mandatory=True)
    live["model"]["w"].add_(100)  # the loop moves on at once
    ckpt.close()
    saved = load_bytes(store.get_bytes(A1.checkpoint(1)))
    assert torch.equal(saved["model"]["w"], torch.full((64,), 1.0))


def test_rotation_keeps_the_newest_and_deletes_objects_after_the_commit(store):
    ckpt = _checkpointer(store, keep_last=2)
    for step in (1, 2, 3, 4):
        ckpt.save(lambda: _state(step), _request(step), mandatory=True)
    ckpt.close()
    manifest = ManifestStore(store, PATHS).read()
    assert [e.step for e in manifest.checkpoints] == [3, 4]
    assert store.list(PATHS.attempts) == [A1.checkpoint(3), A1.checkpoint(4)]


def _entries(*steps: int) -> list[CheckpointEntry]:
    return [CheckpointEntry(key=f"k{s}", step=s, epoch=0, batch_in_epoch=s, kind="step", attempt=1, size=1,
                            sha256="x", created_at=0.0) for s in steps]


def test_rotation_never_drops_the_checkpoint_the_attempt_resumed_from():
    manifest = CheckpointManifest(job_id="j", checkpoints=_entries(1, 2, 3, 4, 5), resumed_from=2, resumed_from_key="k2")
    dropped = rotate(manifest, keep_last=2)
    assert [e.step for e in manifest.checkpoints] == [2, 4, 5]
    assert [e.step for e in dropped] == [1, 3]


def test_rotation_never_deletes_the_best_checkpoint():
    entries = _entries(1, 2, 3, 4)
    best = BestEntry(**entries[1].model_dump(), metric="val_loss", value=0.1)
    manifest = CheckpointManifest(job_id="j", checkpoints=entries, best=best)
    dropped = rotate(manifest, keep_last=1)
    assert [e.step for e in manifest.checkpoints] == [4] and manifest.best.key == "k2"
    assert [e.step for e in dropped] == [1, 3]  # k2 leaves the list; its object stays: it is the best


def test_best_is_a_manifest_reference_and_metrics_are_committed_with_their_checkpoint(store):
    ckpt = _checkpointer(store, keep_last=2)
    rows = [{"epoch": 0, "val_loss": 0.5}]
    ckpt.save(lambda: _state(1), _request(1, "epoch", best=("val_loss", 0.5), metrics_rows=rows), mandatory=True)
    for step in (2, 3, 4):
        ckpt.save(lambda: _state(step), _request(step), mandatory=True)
    ckpt.close()
    manifest = ManifestStore(store, PATHS).read()
    assert manifest.best.step == 1 and manifest.best.value == 0.5 and manifest.best.key == A1.checkpoint(1)
    assert [e.step for e in manifest.checkpoints] == [3, 4]  # rotated out of the list, kept as the best
    assert torch.equal(load_bytes(store.get_bytes(manifest.best.key), manifest.best.sha256)["model"]["w"],
                       torch.full((64,), 1.0))
    assert read_metrics(store, manifest) == rows and manifest.metrics.key == A1.metrics(1)
    assert set(store.list(PATHS.attempts)) == manifest.referenced_keys()


class GatedStore(FileStore):
    """A file store whose uploads wait for a gate: holds a checkpoint in flight on demand."""

    def __init__(self, root):
        super().__init__(root)
        self.gate = threading.Event()

    def put_file(self, key, path, consume=False):
        self.gate.wait(timeout=30)
        super().put_file(key, path, consume)


def test_periodic_checkpoint_is_skipped_while_one_is_in_flight_and_mandatory_ones_wait(tmp_path):
    store = GatedStore(tmp_path)
    ckpt = _checkpointer(store)
    assert ckpt.save(lambda: _state(1), _request(1), mandatory=False)
    assert not ckpt.save(lambda: _state(2), _request(2), mandatory=False)  # skipped, counted
    assert ckpt.totals.skipped == 1
    threading.Timer(0.2, store.gate.set).start()
    assert ckpt.save(lambda: _state(3), _request(3, "epoch"), mandatory=True)  # waits for step 1, then goes
    ckpt.close()
    assert [e.step for e in ManifestStore(store, PATHS).read().checkpoints] == [1, 3]


def test_a_periodic_checkpoint_within_the_minimum_interval_is_skipped_and_a_mandatory_one_is_not(tmp_path):
    store = FileStore(tmp_path)
    ckpt = AsyncCheckpointer(CheckpointTarget(store, PATHS, 1, 5, log=lambda m: None, min_interval_s=3600.0))
    assert ckpt.save(lambda: _state(1), _request(1), mandatory=False)
    ckpt.wait()  # (nothing in flight: only the interval skips the next)
    assert not ckpt.save(lambda: _state(2), _request(2), mandatory=False) and ckpt.totals.skipped == 1
    assert ckpt.save(lambda: _state(3), _request(3, "epoch"), mandatory=True)
    ckpt.wait()
    assert not ckpt.save(lambda: _state(4), _request(4), mandatory=False)  # (the epoch's end counts as the last)
    ckpt.close()
    assert [e.step for e in ManifestStore(store, PATHS).read().checkpoints] == [1, 3]
    unspaced = AsyncCheckpointer(CheckpointTarget(FileStore(tmp_path / "0"), PATHS, 1, 5, log=lambda m: None))
    for step in (1, 2, 3):
        assert unspaced.save(lambda: _state(step), _request(step), mandatory=False)
        unspaced.wait()
    unspaced.close()


def test_a_fenced_out_checkpointer_commits_nothing(store):
    ckpt = _checkpointer(store, attempt=1)
    ckpt.save(lambda: _state(1), _request(1), mandatory=True)
    ckpt.wait()
    ManifestStore(store, PATHS).update(2, lambda m: None)  # another worker took the job over
    ckpt.save(lambda: _state(2), _request(2), mandatory=True)
    with pytest.raises(FencedOut):
        ckpt.close()
    assert [e.step for e in ManifestStore(store, PATHS).read().checkpoints] == [1]


def test_corrupt_latest_falls_back_to_the_previous_one_and_says_so(store):
    ckpt = _checkpointer(store, keep_last=3)
    for step in (1, 2):
        ckpt.save(lambda: _state(step), _request(step), mandatory=True)
    ckpt.close()
    data = bytearray(store.get_bytes(A1.checkpoint(2)))
    data[len(data) // 2] ^= 0xFF
    store.put_bytes(A1.checkpoint(2), bytes(data))

    logged: list[str] = []
    manifests = ManifestStore(store, PATHS)
    state, entry = load_latest_good(store, manifests.read(), logged.append)
    assert entry.step == 1 and torch.equal(state["model"]["w"], torch.full((64,), 1.0))
    assert any("step-2.pt" in m and "sha256" in m and "falling back" in m for m in logged)

    pin_resume_point(manifests, 2, entry, logged.append)
    manifest = manifests.read()
    assert [e.step for e in manifest.checkpoints] == [1] and manifest.resumed_from == 1
    assert not store.exists(A1.checkpoint(2))


def test_missing_latest_falls_back_too(store):
    ckpt = _checkpointer(store, keep_last=3)
    for step in (1, 2):
        ckpt.save(lambda: _state(step), _request(step), mandatory=True)
    ckpt.close()
    store.delete(A1.checkpoint(2))
    logged: list[str] = []
    _, entry = load_latest_good(store, ManifestStore(store, PATHS).read(), logged.append)
    assert entry.step == 1 and any("missing" in m for m in logged)
