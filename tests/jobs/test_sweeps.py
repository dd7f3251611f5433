"""``--set`` overrides and ``baton sweep`` against a real Redis and S3 endpoint (no worker needed:
what is checked is what was queued)."""
from __future__ import annotations

import json

import pytest
import redis

from baton.storage.records import keys
from baton.schemas.errors import SpecError
from baton.schemas.spec import JobSpec
from tests.helpers import make_spec, run_baton, write_spec

QUICK = make_spec(loop={"epochs": 2}, scheduler={"name": "none"})


def _queued_specs(cluster, job_ids):
    r = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
    specs = {}
    for job_id in job_ids:
        record = r.hgetall(keys.job(job_id))
        assert record["state"] == "queued" and "published_at" in record and "publish_pending" not in record
        specs[job_id] = (record, JobSpec.model_validate_json(record["spec"]))
        stored = JobSpec.parse(json.loads(cluster.store().get_bytes(f"jobs/{job_id}/spec.json")))
        assert stored == specs[job_id][1]
    return specs


def test_a_2x3_sweep_queues_6_valid_jobs_sharing_a_sweep_id(cluster, tmp_path):
    spec = write_spec(tmp_path, QUICK)
    result = run_baton("sweep", str(spec), "--grid", "optimizer.lr=1e-3,3e-3", "--grid", "seed=1,2,3",
                       "--set", "loop.epochs=5", "--id", "lrs", env=cluster.env)
    assert result.returncode == 0, result.stdout + result.stderr
    job_ids = result.stdout.splitlines()[1:]
    assert result.stdout.splitlines()[0] == "sweep lrs: 6 jobs queued"
    assert job_ids == [f"lrs-{i}" for i in range(1, 7)]
    specs = _queued_specs(cluster, job_ids)
    assert sorted((s.optimizer.lr, s.seed) for _, s in specs.values()) == \
        sorted((lr, seed) for lr in (0.001, 0.003) for seed in (1, 2, 3))
    for i, (record, s) in enumerate(specs.values(), start=1):
        assert record["sweep"] == "lrs" and s.name == f"t-{i}" and record["name"] == f"t-{i}"
        assert s.loop.epochs == 5 and s.model_dump(exclude={"name", "seed", "optimizer", "loop"}) == \
            JobSpec.parse(QUICK).model_dump(exclude={"name", "seed", "optimizer", "loop"})
        assert json.loads(record["overrides"]) == {"loop.epochs": 5, "optimizer.lr": s.optimizer.lr, "seed": s.seed}
    assert [e.status.id for e in cluster.client.sweep_results("lrs")] == job_ids  # no best values yet: grid order


def test_one_bad_grid_value_refuses_the_whole_sweep(cluster, tmp_path):
    spec = write_spec(tmp_path, QUICK)
    result = run_baton("sweep", str(spec), "--grid", "optimizer.lr=1e-3,-1", "--grid", "seed=1,2", env=cluster.env)
    assert result.returncode == 2
    assert "optimizer.lr: must be > 0" in result.stderr
    assert redis.Redis.from_url(cluster.redis_url).dbsize() == 0
    assert cluster.store().list("") == []
    with pytest.raises(SpecError, match="optimizer.lrr: unknown field"):
        cluster.client.sweep(QUICK, {"optimizer.lrr": [0.1], "seed": [1, 2]})
    assert redis.Redis.from_url(cluster.redis_url).dbsize() == 0


def test_set_with_a_wrong_path_exits_2_naming_it(cluster, tmp_path):
    spec = write_spec(tmp_path, QUICK)
    for command in (["validate"], ["submit"], ["run", "--storage", f"file://{tmp_path / 'data'}"]):
        result = run_baton(*command, str(spec), "--set", "optimizer.lrr=1e-3", env=cluster.env)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert "optimizer.lrr: unknown field" in result.stderr
    result = run_baton("submit", str(spec), "--set", "loop.epochs=many", env=cluster.env)
    assert result.returncode == 2 and "loop.epochs: must be an integer (got 'many')" in result.stderr
    assert redis.Redis.from_url(cluster.redis_url).dbsize() == 0
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").rglob("*.json"))


def test_set_overrides_what_is_queued(cluster, tmp_path):
    spec = write_spec(tmp_path, QUICK)
    result = run_baton("submit", str(spec), "--id", "tuned", "--set", "optimizer.lr=1e-3", "--set", "loop.epochs=5",
                       env=cluster.env)
    assert result.returncode == 0, result.stderr
    (record, queued), = _queued_specs(cluster, ["tuned"]).values()
    assert (queued.optimizer.lr, queued.loop.epochs, record["epochs"]) == (0.001, 5, "5")
    job = cluster.client.submit(QUICK, "tuned-py", overrides={"optimizer.lr": 3e-3})
    assert job.status().overrides == {"optimizer.lr": 3e-3}


def test_list_sweep_ranks_by_the_monitor_direction(cluster, tmp_path):
    # val_accuracy improves upwards: the highest best_value comes first
    spec = make_spec(loop={"epochs": 1}, scheduler={"name": "none"}, checkpoint={"monitor": "val_accuracy", "mode": "max"})
    queued = cluster.client.sweep(spec, ["seed=1,2,3"], sweep_id="acc")
    r = redis.Redis.from_url(cluster.redis_url)
    for job, value in zip(queued.jobs, (0.5, 0.9)):  # what workers record after each validation
        r.hset(keys.job(job.id), mapping={"best_value": value, "best_checkpoint": "k"})
    ranked = [(e.status.id, e.best_value) for e in cluster.client.sweep_results("acc")]
    assert ranked == [("acc-2", 0.9), ("acc-1", 0.5), ("acc-3", None)]
    shown = run_baton("list", "--sweep", "acc", env=cluster.env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "BEST val_accuracy (max)" in lines[0] and "seed" in lines[0]
    assert [line.split()[0] for line in lines[1:]] == ["acc-2", "acc-1", "acc-3"]
    assert run_baton("list", "--sweep", "nope", env=cluster.env).returncode == 1
