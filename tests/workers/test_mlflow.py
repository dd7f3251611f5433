"""MLflow tracking against a real ``mlflow server`` (SQLite): a job SIGKILLed and resumed is one run
whose metric history equals metrics.jsonl step for step, params equal to the spec; an MLflow outage
mid-run leaves the job unaffected and its gap logged."""
from __future__ import annotations

import json
import time

import pytest

from schemas.spec import JobSpec
from storage.file_store import FileStore
from tests.helpers import baton_env, committed_manifest, kill_when, make_spec, metrics_rows, run_baton, start_baton, write_spec
from tests.netfault import FaultyProxy
from workers.control import LoopControl
from workers.mlflow_tracking import flatten, row_metrics
from workers.session import run_attempt

mlflow = pytest.importorskip("mlflow")

SPEC = make_spec(data={"target": "tests.probes:slow_spiral", "kwargs": {"n_per_class": 300, "delay_s": 0.003}},
                 loop={"epochs": 3}, checkpoint={"every_steps": 5})


def _client(url: str):
    return mlflow.MlflowClient(tracking_uri=url)


def _run_id(store, job_id: str):
    try:
        return json.loads(store.get_bytes(f"jobs/{job_id}/mlflow.json"))["run_id"]
    except FileNotFoundError:
        return None


def _logged_steps(client, run_id) -> list[int]:
    return [m.step for m in client.get_metric_history(run_id, "train_loss")] if run_id else []


def test_a_killed_and_resumed_job_is_one_run_each_step_once(mlflow_server, tmp_path):
    spec_path = write_spec(tmp_path, SPEC)
    store = FileStore(tmp_path / "store")
    experiment = f"resume-{tmp_path.name}"
    env = baton_env(MLFLOW_TRACKING_URI=mlflow_server.url, MLFLOW_EXPERIMENT_NAME=experiment,
                    MLFLOW_DISABLE_TELEMETRY="true")
    client = _client(mlflow_server.url)

    def first_row_in_mlflow_mid_epoch(manifest: dict) -> bool:
        latest = manifest["checkpoints"][-1] if manifest["checkpoints"] else None
        return (latest is not None and latest["kind"] == "step" and latest["epoch"] == 1
                and latest["batch_in_epoch"] > 0 and bool(_logged_steps(client, _run_id(store, "cut"))))

    proc = start_baton("run", str(spec_path), "--id", "cut", "--storage", store.url, "--no-progress", env=env,
                       log=tmp_path / "cut-1.log")
    at_kill = kill_when(proc, store, "cut", first_row_in_mlflow_mid_epoch)
    resumed_from = at_kill["checkpoints"][-1]["step"]
    resumed = run_baton("run", str(spec_path), "--id", "cut", "--storage", store.url, "--no-progress", env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming cut from step {resumed_from}" in resumed.stdout

    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == 1, "a resumed attempt continues the job's run"
    run = runs[0]
    assert run.info.run_id == _run_id(store, "cut") and run.info.status == "FINISHED"
    assert run.data.params == flatten(json.loads(store.get_bytes("jobs/cut/spec.json")))
    assert run.data.params["optimizer.lr"] == "0.01" and run.data.params["loop.epochs"] == "3"

    rows = metrics_rows(store, "cut")
    assert len(rows) == 3 and rows[0]["step"] < resumed_from < rows[-1]["step"]
    keys = set().union(*(row_metrics(row) for row in rows))
    assert {"train_loss", "val_loss", "val_accuracy", "lr", "grad_norm", "epoch"} <= keys
    for key in keys:  # step for step, no duplicates (a step logged twice would show twice)
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert history == [(row["step"], float(row[key])) for row in rows if key in row], key

    tags = run.data.tags
    manifest = committed_manifest(store, "cut")
    assert tags["baton.job_id"] == "cut" and tags["baton.attempts"] == "2"
    assert {"baton.worker.attempt-1", "baton.worker.attempt-2"} <= set(tags)
    assert tags["baton.best_checkpoint"] == f"{store.url}/{manifest.best.key}"
    assert tags["baton.best_metric"] == "val_loss" and float(tags["baton.best_value"]) == manifest.best.value
    assert tags["baton.final_model"] == f"{store.url}/{manifest.final.model.key}"


class _CutMlflowMidRun(LoopControl):
    """Cuts the connection to MLflow at the second validation, once the first row (its metrics, then
    its best-checkpoint tags) is in MLflow."""

    def __init__(self, proxy: FaultyProxy, store, job_id: str, client):
        self.proxy, self.store, self.job_id, self.client = proxy, store, job_id, client
        self.lines: list[str] = []

    def on_epoch(self, row: dict) -> None:
        if row["epoch"] == 1:
            deadline = time.monotonic() + 30
            while not self._first_row_logged() and time.monotonic() < deadline:
                time.sleep(0.1)
            self.proxy.set("cut")

    def _first_row_logged(self) -> bool:
        run_id = _run_id(self.store, self.job_id)
        return bool(run_id and "baton.best_step" in self.client.get_run(run_id).data.tags)

    def log(self, message: str) -> None:
        self.lines.append(message)


def test_mlflow_down_mid_run_the_job_finishes_and_the_gap_is_logged(mlflow_server, tmp_path, monkeypatch):
    proxy = FaultyProxy(mlflow_server.port)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", proxy.endpoint_url)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", f"outage-{tmp_path.name}")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    store = FileStore(tmp_path / "store")
    client = _client(mlflow_server.url)
    control = _CutMlflowMidRun(proxy, store, "outage", client)
    spec = make_spec(loop={"epochs": 3}, checkpoint={"every_steps": 5})
    try:
        started = time.monotonic()
        result = run_attempt(JobSpec.parse(spec), "outage", store, 1, control, allowed_prefixes=("tests",))
        took_s = time.monotonic() - started
    finally:
        proxy.close()

    assert result.outcome.completed and committed_manifest(store, "outage").completed
    assert took_s < 30, f"an MLflow outage must not hold the job up ({took_s:.1f}s)"
    rows = metrics_rows(store, "outage")
    logged = _logged_steps(client, _run_id(store, "outage"))
    assert logged == [rows[0]["step"]], "the rows before the outage are in MLflow, the rest are the gap"
    text = "\n".join(control.lines)
    assert "held back and retried in the background; training goes on" in text, text
    assert f"gap in run {_run_id(store, 'outage')}: steps {rows[1]['step']}..{rows[2]['step']}" in text, text
