"""Issue 9, "nothing lost, nothing overwritten": an attempt that was fenced out (frozen, then woken
after another attempt took the job over) must not change a byte any manifest refers to, and every
reader (resume, JobClient) finds objects through manifest.json only.

The stale attempt talks to the real S3 endpoint through a gateway that can freeze it at an exact
request (tests/s3_gateway.py); the attempt that takes over talks to the endpoint directly. Both
checkpoint writers are tested: the writer process (whose store reaches the gateway through
AWS_ENDPOINT_URL, as a worker's would) and the thread writer (given a client configured in code)."""
from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from safetensors.torch import load_file

from baton.jobs.client import Job, JobClient
from baton.schemas.errors import FencedOut
from baton.schemas.spec import JobSpec
from baton.storage.checkpoint_io import load_bytes, rows_of
from baton.storage.checkpointing.contract import CheckpointRequest, CheckpointTarget
from baton.storage.checkpointing.checkpointer import AsyncCheckpointer
from baton.storage.layout import JobPaths
from baton.storage.manifest_store import ManifestStore
from baton.storage.stores.open import open_store
from baton.workers.attempt.finalize import finalize
from baton.workers.attempt.resume import load_latest_good, pin_resume_point
from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt
from baton.workers.training.control import LoopControl

from tests.helpers import make_spec
from tests.storage.conftest import store_through


def _state(step: int, attempt: int) -> dict:
    """A checkpoint whose bytes say which attempt wrote it."""
    return {"format": 1, "model": {"w": torch.full((64,), float(step * 100 + attempt))}, "progress": {"global_step": step}}


def _request(step: int, kind: str = "epoch", **extra) -> CheckpointRequest:
    return CheckpointRequest(step=step, epoch=step // 10, batch_in_epoch=0, kind=kind, **extra)


def _checkpointer(store, paths, attempt: int) -> AsyncCheckpointer:
    return AsyncCheckpointer(CheckpointTarget(store, paths, attempt, keep_last=3, log=lambda m: None))


def _stale_checkpointer(writer: str, gateway, bucket: str, paths, attempt: int, monkeypatch) -> AsyncCheckpointer:
    """A checkpointer whose every request passes through ``gateway``, with the given writer."""
    if writer == "thread":
        ckpt = _checkpointer(store_through(gateway, bucket), paths, attempt)
    else:
        direct = os.environ["AWS_ENDPOINT_URL"]
        monkeypatch.setenv("AWS_ENDPOINT_URL", gateway.endpoint_url)  # what the writer process starts with
        ckpt = _checkpointer(open_store(f"s3://{bucket}/runs"), paths, attempt)
        monkeypatch.setenv("AWS_ENDPOINT_URL", direct)
        assert ckpt.wait_for_writer(60)  # from here on the process writes (before, the thread did)
    assert ckpt.writer == writer
    return ckpt


def _wait_for_writers(*checkpointers: AsyncCheckpointer, timeout_s: float = 30) -> None:
    """Wait for every writer, abandoned ones included, to end: threads, then processes."""
    _join_checkpoint_threads(timeout_s)
    for ckpt in checkpointers:
        if ckpt._process is not None:
            ckpt._process.proc.wait(timeout_s)


def _wait_held(gateway, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not gateway.held:
        assert time.monotonic() < deadline, f"nothing was held; requests: {gateway.seen}"
        time.sleep(0.005)


def _join_checkpoint_threads(timeout_s: float = 30) -> None:
    """Wait for every background checkpoint thread, abandoned ones included, to end."""
    for thread in threading.enumerate():
        if thread.name.startswith("baton-checkpoint"):
            thread.join(timeout_s)


def _take_over(store, paths, attempt: int) -> AsyncCheckpointer:
    """What a new attempt does first: claim the manifest, load the latest good checkpoint, pin it."""
    manifests = ManifestStore(store, paths)
    manifest = manifests.update(attempt, lambda m: None)
    _, entry = load_latest_good(store, manifest, lambda m: None)
    pin_resume_point(manifests, attempt, entry, lambda m: None)
    return _checkpointer(store, paths, attempt)


def _assert_references_hold_their_committed_bytes(store, paths) -> None:
    manifest = ManifestStore(store, paths).read()
    for entry in [*manifest.checkpoints, manifest.best]:
        load_bytes(store.get_bytes(entry.key), entry.sha256, where=entry.key)  # CheckpointCorrupt if overwritten


@pytest.fixture
def stores(s3_bucket, gateway):
    """(the stale attempt's store, through the gateway; the new attempt's store, direct)."""
    return store_through(gateway, s3_bucket), open_store(f"s3://{s3_bucket}/runs")


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["process", "thread"])
def test_a_stale_attempt_woken_after_a_takeover_overwrites_nothing(writer, s3_bucket, gateway, monkeypatch):
    store = open_store(f"s3://{s3_bucket}/runs")
    paths = JobPaths("takeover")
    old = _stale_checkpointer(writer, gateway, s3_bucket, paths, 1, monkeypatch)
    old.save(lambda: _state(10, 1), _request(10, best=("val_loss", 0.5)), mandatory=True)
    old.wait()
    gateway.hold(lambda method, path: method == "PUT")  # attempt 1 freezes as its next write leaves
    old.save(lambda: _state(20, 1), _request(20, best=("val_loss", 0.4)), mandatory=True)
    _wait_held(gateway)

    new = _take_over(store, paths, 2)  # resumes from step 10, commits step 20 and a new best
    new.save(lambda: _state(20, 2), _request(20, best=("val_loss", 0.3)), mandatory=True)
    new.wait()

    gateway.release()  # attempt 1 wakes up: its upload goes on, its commit is refused
    with pytest.raises(FencedOut):
        old.wait()
    old.abandon()
    _assert_references_hold_their_committed_bytes(store, paths)
    manifest = ManifestStore(store, paths).read()
    assert manifest.attempt == 2 and [(e.step, e.attempt) for e in manifest.checkpoints] == [(10, 1), (20, 2)]
    assert torch.equal(load_bytes(store.get_bytes(manifest.best.key))["model"]["w"], _state(20, 2)["model"]["w"])

    # the stale attempt's unreferenced object is garbage-collected by the next commit; what the
    # manifest refers to (attempt 1's step 10, the resume point) stays
    _wait_for_writers(old)
    new.save(lambda: _state(30, 2), _request(30), mandatory=True)
    new.close()
    manifest = ManifestStore(store, paths).read()
    left = set(store.list(paths.root + "/"))
    assert left == manifest.referenced_keys() | {paths.manifest}
    _assert_references_hold_their_committed_bytes(store, paths)


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_abandon_cancels_the_upload_in_flight_and_nothing_is_committed_after(writer, s3_bucket, gateway, monkeypatch):
    store = open_store(f"s3://{s3_bucket}/runs")
    paths = JobPaths("abandoned")
    ckpt = _stale_checkpointer(writer, gateway, s3_bucket, paths, 1, monkeypatch)
    ckpt.save(lambda: _state(10, 1), _request(10), mandatory=True)
    ckpt.wait()
    gateway.hold(lambda method, path: method == "PUT")
    ckpt.save(lambda: _state(20, 1), _request(20), mandatory=True)
    _wait_held(gateway)

    abandoning = threading.Thread(target=ckpt.abandon)
    abandoning.start()
    abandoning.join(timeout=5)
    returned_while_held = not abandoning.is_alive()
    gateway.release()
    abandoning.join(timeout=60)
    _wait_for_writers(ckpt)
    assert returned_while_held, "abandon() waited for the upload in flight"
    assert [e.step for e in ManifestStore(store, paths).read().checkpoints] == [10]


def test_a_refused_commit_leaves_best_agreeing_with_the_manifest(store):
    paths = JobPaths("refused")
    old = _checkpointer(store, paths, 1)
    old.save(lambda: _state(10, 1), _request(10, best=("val_loss", 0.5)), mandatory=True)
    old.wait()
    ManifestStore(store, paths).update(2, lambda m: None)  # another worker took the job over
    old.save(lambda: _state(20, 1), _request(20, best=("val_loss", 0.4), metrics_rows=[{"epoch": 1}]), mandatory=True)
    with pytest.raises(FencedOut):
        old.close()
    _assert_references_hold_their_committed_bytes(store, paths)
    assert ManifestStore(store, paths).read().best.step == 10


@pytest.fixture
def client(redis_server, s3_bucket):
    url = f"s3://{s3_bucket}/runs"

    def job(job_id: str) -> Job:
        c = JobClient(redis_url=redis_server.url, storage_url=url)
        c.records.create(job_id, {"name": "t", "storage_url": url, "queue": "default"})
        return Job(c, job_id)
    return job


def test_metrics_of_a_stale_attempt_never_replace_the_committed_ones(stores, gateway, client):
    stale_store, store = stores
    paths = JobPaths("metrics-race")
    rows = [{"epoch": 0, "attempt": 1}, {"epoch": 1, "attempt": 1}]
    old = _checkpointer(stale_store, paths, 1)
    old.save(lambda: _state(10, 1), _request(10, metrics_rows=rows[:1]), mandatory=True)
    old.wait()
    # attempt 1 commits step 20, then freezes right after its manifest write went through
    start = len(gateway.seen)
    gateway.hold(lambda method, path: any(m == "PUT" and p.split("?")[0].endswith("/manifest.json")
                                          for m, p in gateway.seen[start:-1]))
    old.save(lambda: _state(20, 1), _request(20, metrics_rows=rows), mandatory=True)
    _wait_held(gateway)

    new = _take_over(store, paths, 2)  # resumes from attempt 1's committed step 20
    newer_rows = rows + [{"epoch": 2, "attempt": 2}]
    new.save(lambda: _state(30, 2), _request(30, metrics_rows=newer_rows), mandatory=True)
    new.close()
    gateway.release()
    old.abandon()
    _join_checkpoint_threads()
    assert client("metrics-race").metrics() == newer_rows


def test_final_artifacts_of_a_stale_attempt_never_replace_the_committed_ones(client, s3_bucket, tmp_path):
    store = open_store(f"s3://{s3_bucket}/runs")
    spec = JobSpec.parse(make_spec(loop={"epochs": 2}))
    quiet = type("Quiet", (LoopControl,), {"log": lambda self, m: None})()
    assert run_attempt(Attempt(spec, "final-race", 2, store), AttemptOptions(quiet)).outcome.completed

    # attempt 1 passed its lease check before it froze; it wakes up and finalizes its own model
    stale_model = torch.nn.Linear(2, 3)
    manifest = ManifestStore(store, JobPaths("final-race")).read()
    last = load_bytes(store.get_bytes(manifest.latest.key))
    with pytest.raises(FencedOut):
        finalize(CheckpointTarget(store, JobPaths("final-race"), 1, 3, log=lambda m: None), spec.model_dump(mode="json"),
                 stale_model, rows_of(last["metrics"]), last["best"])

    out = client("final-race").download(tmp_path, which="final")
    weights = load_file(str(out / "model.safetensors"))
    assert weights.keys() == last["model"].keys() and all(torch.equal(weights[k], last["model"][k]) for k in weights)
