"""TensorBoard event files: every metrics row's scalars at its step, each step once across attempts,
read back with TensorBoard's own reader after a job was SIGKILLed and resumed (over S3): also when
the kill came between a row's commit and its event file's upload, and when the resume fell back past
a corrupt checkpoint to before a row an earlier attempt's event file holds."""
from __future__ import annotations

import numpy as np
import pytest

from baton.storage.stores.open import open_store
from baton.workers.tracking.tensorboard import CURVE_TAG, row_scalars

from tests.helpers import baton_env, kill_when, make_spec, metrics_rows, run_baton, start_baton, write_spec
from tests.workers.conftest import SPEC as WORKER_SPEC

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

# samples paced like real data, so the first attempt is still in its second epoch while its first
# event file upload is checked for
SPEC = make_spec(data={"target": "tests.probes:slow_spiral", "kwargs": {"n_per_class": 300, "delay_s": 0.003}},
                 loop={"epochs": 3}, checkpoint={"every_steps": 5})


def _scalars(directory) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files of ``directory``, by tag; nothing purged, so a step written
    twice shows twice."""
    acc = event_accumulator.EventAccumulator(str(directory), purge_orphaned_data=False,
                                             size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _download(store, prefix: str, directory) -> list[str]:
    keys = store.list(prefix)
    for key in keys:
        store.get_file(key, directory / key.rsplit("/", 1)[1])
    return keys


@pytest.mark.slow
def test_event_files_hold_every_row_once_after_a_kill_and_resume(s3_bucket, s3_env, tmp_path):
    spec_path = write_spec(tmp_path, SPEC)
    url = f"s3://{s3_bucket}/runs"
    store = open_store(url)
    env = baton_env(**s3_env)
    first_events = "jobs/cut/attempt-1/tensorboard/"

    def after_first_row_mid_epoch(manifest: dict) -> bool:
        latest = manifest["checkpoints"][-1] if manifest["checkpoints"] else None
        return (latest is not None and latest["kind"] == "step" and latest["epoch"] == 1
                and latest["batch_in_epoch"] > 0 and bool(store.list(first_events)))

    proc = start_baton("run", str(spec_path), "--id", "cut", "--storage", url, "--no-progress", env=env,
                       log=tmp_path / "cut-1.log")
    at_kill = kill_when(proc, store, "cut", after_first_row_mid_epoch)
    resumed_from = at_kill["checkpoints"][-1]["step"]
    resumed = run_baton("run", str(spec_path), "--id", "cut", "--storage", url, "--no-progress", env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming cut from step {resumed_from}" in resumed.stdout

    rows = metrics_rows(store, "cut")
    assert len(rows) == 3 and rows[0]["step"] < resumed_from < rows[-1]["step"]
    expected: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for tag, value in row_scalars(row).items():
            expected.setdefault(tag, []).append((row["step"], float(np.float32(value))))
    assert {"train_loss", "val_loss", "val_accuracy", "lr", "grad_norm", "samples_per_s"} <= set(expected)
    curve = [(int(step), float(np.float32(loss))) for row in rows for step, loss in row["train_curve"]]
    assert [step for step, _ in curve] == list(range(1, rows[-1]["step"] + 1))  # every step once, across the kill
    expected[CURVE_TAG] = curve

    # each attempt wrote its own event file: the first up to its kill, the resumed one after its resume step
    per_attempt = {}
    for attempt in (1, 2):
        directory = tmp_path / f"attempt-{attempt}"
        directory.mkdir()
        assert len(_download(store, f"jobs/cut/attempt-{attempt}/tensorboard/", directory)) == 1
        per_attempt[attempt] = _scalars(directory)
    first, second = ([s for s, _ in per_attempt[a]["val_loss"]] for a in (1, 2))
    assert first and all(step <= resumed_from for step in first)
    assert second and all(step > resumed_from for step in second)
    assert first + second == [row["step"] for row in rows]

    # all of the job's event files together, as `tensorboard --logdir` on the job's prefix reads them
    together = tmp_path / "together"
    together.mkdir()
    keys = [k for k in store.list("jobs/cut/") if "/tensorboard/" in k]
    for key in keys:
        store.get_file(key, together / key.rsplit("/", 1)[1])
    assert len(keys) == 2
    assert _scalars(together) == expected  # step for step, equal to metrics.jsonl, no duplicates


def _val_loss_everywhere(store, job_id: str, directory) -> list[tuple[int, float]]:
    """val_loss over all of the job's event files together (as `tensorboard --logdir` on the job's
    prefix reads them), in step order, a step written twice listed twice."""
    directory.mkdir()
    for key in store.list(f"jobs/{job_id}/"):
        if "/tensorboard/" in key:
            store.get_file(key, directory / key.rsplit("/", 1)[1])
    return sorted(_scalars(directory).get("val_loss", []))


def _committed_val_loss(store, job_id: str) -> list[tuple[int, float]]:
    return [(row["step"], float(np.float32(row["val_loss"]))) for row in metrics_rows(store, job_id)]


def _in_second_epoch(manifest: dict) -> bool:
    latest = manifest["checkpoints"][-1] if manifest["checkpoints"] else None
    return (manifest["metrics"] is not None and latest is not None and latest["kind"] == "step"
            and latest["epoch"] == 1 and latest["batch_in_epoch"] > 0)


@pytest.mark.slow
def test_a_row_committed_by_a_killed_attempt_before_its_event_file_upload_is_written_by_the_next(
        cluster, s3_server, tmp_path):
    from tests.s3_gateway import S3Gateway

    gateway = S3Gateway(s3_server.port)  # the first worker's event file uploads never arrive
    gateway.hold(lambda method, path: method == "PUT" and "/tensorboard/" in path)
    try:
        first, = cluster.start_workers(1, AWS_ENDPOINT_URL=gateway.endpoint_url)
        job = cluster.client.submit(WORKER_SPEC, "unsent")
        store = cluster.store()
        kill_when(first.proc, store, "unsent",
                  lambda m: _in_second_epoch(m) and not store.list("jobs/unsent/attempt-1/tensorboard/"))
        first_row = metrics_rows(store, "unsent")[0]["step"]  # committed, in no event file

        cluster.start_workers(1)
        final = job.wait(timeout=120, progress=False)
        assert final.state.value == "succeeded" and final.attempt == 2, final.error
        assert final.resumed_from > first_row
        assert _val_loss_everywhere(store, "unsent", tmp_path / "events") == _committed_val_loss(store, "unsent")
    finally:
        gateway.close()


@pytest.mark.slow
def test_a_fallback_past_corrupt_checkpoints_writes_no_step_twice(cluster, tmp_path):
    spec = make_spec(**{**WORKER_SPEC, "checkpoint": {**WORKER_SPEC["checkpoint"], "keep_last": 20}})
    first, = cluster.start_workers(1)
    job = cluster.client.submit(spec, "fellback")
    store = cluster.store()
    at_kill = kill_when(first.proc, store, "fellback",
                        lambda m: _in_second_epoch(m) and bool(store.list("jobs/fellback/attempt-1/tensorboard/")))
    first_row = metrics_rows(store, "fellback")[0]["step"]  # in attempt 1's event file
    for entry in at_kill["checkpoints"]:
        if entry["step"] >= first_row:  # every checkpoint since the first row is corrupt: resumed before it
            store.put_bytes(entry["key"], b"not a checkpoint")

    cluster.start_workers(1)
    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded" and final.attempt == 2, final.error
    assert final.resumed_from < first_row  # the first row was trained (and its scalars produced) again
    assert _val_loss_everywhere(store, "fellback", tmp_path / "events") == _committed_val_loss(store, "fellback")
