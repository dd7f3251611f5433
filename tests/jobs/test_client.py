"""The user's surface against real services: JobClient and the baton CLI."""
from __future__ import annotations

import json

import pytest
import redis
import torch
from safetensors.torch import load_file

from baton.schemas.errors import SpecError
from baton.storage.checkpoint_io import load_bytes
from tests.helpers import make_spec, run_baton, write_spec

QUICK = make_spec(loop={"epochs": 2}, scheduler={"name": "none"}, checkpoint={"every_steps": 5})


def test_invalid_spec_is_refused_at_submit_and_nothing_reaches_redis(cluster, tmp_path):
    bad = write_spec(tmp_path, make_spec(optimizer={"lr": 0}, checkpoint={"keep_last": 1}))
    result = run_baton("submit", str(bad), env=cluster.env)
    assert result.returncode == 2
    assert "optimizer.lr: must be > 0" in result.stderr and "checkpoint.keep_last" in result.stderr
    assert redis.Redis.from_url(cluster.redis_url).dbsize() == 0
    assert cluster.store().list("") == []
    with pytest.raises(SpecError, match="model.target"):
        cluster.client.submit(make_spec(model={"target": "os:system", "kwargs": {}}))
    assert redis.Redis.from_url(cluster.redis_url).dbsize() == 0


@pytest.mark.slow
def test_submit_wait_status_list_metrics_and_fetch(cluster, tmp_path):
    from tests.workers.queue.test_worker_loss import wait_for

    never = cluster.client.submit(QUICK, "never")  # cancelled while queued: it never runs
    assert never.cancel() == "cancelled"
    worker, = cluster.start_workers(1)  # now its message is delivered: the claim drops it
    wait_for(lambda: "job never attempt 1: dropped (state cancelled)" in worker.log(), timeout=20)
    assert never.status().state.value == "cancelled" and never.status().attempt == 0

    result = run_baton("submit", str(write_spec(tmp_path, QUICK)), "--id", "quick", "--wait", env=cluster.env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "quick succeeded attempt 1" in result.stdout

    job = cluster.client.job("quick")
    status = job.status()
    assert status.state.value == "succeeded" and status.step == status.total_steps > 0
    manifest = json.loads(cluster.store().get_bytes("jobs/quick/manifest.json"))
    assert status.latest_checkpoint == manifest["checkpoints"][-1]["key"] \
        == f"jobs/quick/attempt-1/checkpoints/step-{status.total_steps}.pt"
    assert status.best_checkpoint == manifest["best"]["key"]
    assert [s.id for s in cluster.client.list()] == ["quick", "never"]
    shown = run_baton("status", "quick", env=cluster.env).stdout
    assert "succeeded" in shown and "best checkpoint" in shown
    assert "quick" in run_baton("list", env=cluster.env).stdout

    rows = job.metrics()
    assert [r["epoch"] for r in rows] == [1, 2] and rows[-1]["step"] == status.total_steps

    best = job.download(tmp_path / "out", which="best")
    state = load_bytes(best.read_bytes())
    assert state["progress"]["global_step"] == json.loads(cluster.store().get_bytes("jobs/quick/manifest.json"))["best"]["step"]
    final_dir = job.download(tmp_path / "out", which="final")
    weights = load_file(str(final_dir / "model.safetensors"))
    latest = load_bytes(job.download(tmp_path / "out", which="latest").read_bytes())
    assert weights.keys() == latest["model"].keys()
    assert all(torch.equal(weights[k], latest["model"][k]) for k in weights)
    assert json.loads((final_dir / "report.json").read_text())["best"]["why"]
    fetched = run_baton("fetch", "quick", "--which", "final", "-o", str(tmp_path / "cli"), env=cluster.env)
    assert fetched.returncode == 0 and (tmp_path / "cli/quick/curves.png").is_file()


def test_ids_are_unique(cluster):
    cluster.client.submit(QUICK, "same")
    with pytest.raises(SpecError, match="already exists"):
        cluster.client.submit(QUICK, "same")
    assert run_baton("status", "nope", env=cluster.env).returncode == 1
