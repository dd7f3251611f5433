"""MLflow tracking against a real ``mlflow server`` (SQLite): an MLflow outage mid-run leaves the job
unaffected and its gap logged, in the job's own log too. (A job SIGKILLed and resumed on workers is
one run, each step once: tests/workers/tracking/test_job_logs.py.)"""
from __future__ import annotations

import json
import os
import time

import pytest
from typer.testing import CliRunner

from baton.cli import app
from baton.schemas.spec import JobSpec
from baton.storage.stores.file_store import FileStore
from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt
from baton.workers.tracking.mlflow_tracking import flatten, row_metrics
from baton.workers.training.control import LoopControl

from tests.helpers import committed_manifest, make_spec, metrics_rows
from tests.netfault import FaultyProxy

mlflow = pytest.importorskip("mlflow")

def _client(url: str):
    return mlflow.MlflowClient(tracking_uri=url)


def _run_id(store, job_id: str):
    try:
        return json.loads(store.get_bytes(f"jobs/{job_id}/mlflow.json"))["run_id"]
    except FileNotFoundError:
        return None


def _logged_steps(client, run_id) -> list[int]:
    return [m.step for m in client.get_metric_history(run_id, "train_loss")] if run_id else []


class _CutMlflowMidRun(LoopControl):
    """Cuts the connection to MLflow at the second validation, once the first row (its metrics, then
    its best-checkpoint tags) is in MLflow."""

    def __init__(self, proxy: FaultyProxy, store, job_id: str, client):
        self.proxy, self.store, self.job_id, self.client = proxy, store, job_id, client
        self.lines: list[str] = []

    def on_epoch(self, row: dict) -> None:
        if row["epoch"] == 2:  # the second validation (epochs count from 1)
            deadline = time.monotonic() + 30
            while not self._first_row_logged() and time.monotonic() < deadline:
                time.sleep(0.1)
            self.proxy.set("cut")

    def _first_row_logged(self) -> bool:
        run_id = _run_id(self.store, self.job_id)
        return bool(run_id and "baton.best_step" in self.client.get_run(run_id).data.tags)

    def log(self, message: str) -> None:
        self.lines.append(message)
        os.write(1, f"{message}\n".encode())  # into the job's own log, as `baton run` prints it (pytest swaps sys.stdout)


@pytest.fixture
def proxy(mlflow_server):
    p = FaultyProxy(mlflow_server.port)
    yield p
    p.close()


def test_mlflow_down_mid_run_the_job_finishes_and_the_gap_is_logged(mlflow_server, proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", proxy.endpoint_url)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", f"outage-{tmp_path.name}")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    store = FileStore(tmp_path / "store")
    client = _client(mlflow_server.url)
    control = _CutMlflowMidRun(proxy, store, "outage", client)
    spec = make_spec(loop={"epochs": 3}, checkpoint={"every_steps": 5})
    spec_json = JobSpec.parse(spec).model_dump(mode="json")
    started = time.monotonic()
    result = run_attempt(Attempt(JobSpec.parse(spec), "outage", 1, store, allowed_prefixes=("tests",)), AttemptOptions(control, job_log=True))
    took_s = time.monotonic() - started
    proxy.set("pass")  # MLflow is back (the job's run id was stored with the proxy's address)

    assert result.outcome.completed and committed_manifest(store, "outage").completed
    assert took_s < 30, f"an MLflow outage must not hold the job up ({took_s:.1f}s)"
    rows = metrics_rows(store, "outage")
    logged = _logged_steps(client, _run_id(store, "outage"))
    assert logged == [rows[0]["step"]], "the rows before the outage are in MLflow, the rest are the gap"
    text = "\n".join(control.lines)
    assert "held back and retried in the background; training goes on" in text, text
    gap = f"gap in run {_run_id(store, 'outage')}: steps {rows[1]['step']}..{rows[2]['step']}"
    assert gap in text, text

    # ... and in the job's own log, which `baton logs` reads from the store alone (a `baton run` job)
    shown = CliRunner().invoke(app, ["logs", "outage", "--storage", store.url, "-f"])  # -f: ends with the attempt
    assert shown.exit_code == 0, shown.output
    assert gap in shown.output and shown.output.splitlines()[-1].endswith(" baton attempt 1 ended: succeeded")

    # the next attempt of the job sends what MLflow lacks, each metric stamped with its row's own time
    tracker = _tracker(proxy.endpoint_url, store, "outage", 2, spec_json)
    tracker.close()
    run_id = _run_id(store, "outage")
    history = client.get_metric_history(run_id, "train_loss")
    assert [(m.step, m.value, m.timestamp) for m in history] == [
        (row["step"], row["train_loss"], int(row["time"] * 1000)) for row in rows]
    # an attempt whose view of MLflow is stale (fenced out while MLflow was away, still retrying)
    # sends the same committed rows again: the same metrics, which MLflow keeps once
    tracker._logged_through, tracker._ready = -1, [dict(row) for row in rows]
    tracker._send_rows(tracker._client())
    assert [m.step for m in client.get_metric_history(run_id, "train_loss")] == [row["step"] for row in rows]
    assert set(client.get_run(run_id).data.metrics) == set().union(*(row_metrics(row) for row in rows))


def _tracker(url: str, store, job_id: str, attempt: int, spec: dict):
    from baton.storage.layout import JobPaths
    from baton.workers.tracking.mlflow_tracking import MlflowTracker

    return MlflowTracker(url, store, JobPaths(job_id, attempt), spec, "val_loss", "test-worker", lambda message: None)


def test_params_a_killed_attempt_left_out_are_logged_when_the_run_is_opened_again(mlflow_server, tmp_path, monkeypatch):
    """The run id is stored before the params are logged: an attempt killed (or a network failure)
    in between must not leave the run without its params for good."""
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", f"params-{tmp_path.name}")
    store = FileStore(tmp_path / "store")
    client = _client(mlflow_server.url)
    experiment_id = client.create_experiment(f"params-{tmp_path.name}")
    run_id = client.create_run(experiment_id, run_name="half").info.run_id
    store.put_bytes("jobs/half/mlflow.json", json.dumps(
        {"tracking_uri": mlflow_server.url, "experiment_id": experiment_id, "run_id": run_id}).encode())
    spec = JobSpec.parse(make_spec(loop={"epochs": 2})).model_dump(mode="json")
    tracker = _tracker(mlflow_server.url, store, "half", 2, spec)
    tracker.close()
    assert client.get_run(run_id).data.params == flatten(spec)
