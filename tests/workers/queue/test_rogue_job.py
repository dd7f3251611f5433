"""A job's code that turns on its worker (tests.rogue). What it writes into the channel between its training
process and the worker is heard as data, not run as code: a pickle is refused unread, a message of the
wrong shape too; the attempt ends as the job's failure, saying why, and the worker goes on to run the next
job. The store its training process holds reaches that job's objects alone, and its environment holds
none of the pool's credentials. Run as a user of its own (a root worker's default), it reaches nothing of
its worker's or of another job's, and still resumes bit-exact after its worker is SIGKILLed."""
from __future__ import annotations

import json
import secrets

import pytest
import redis

from baton.jobs.services import RedisServer

from tests.conftest import Cluster
from tests.helpers import assert_same_training, baton_env, kill_when, make_spec, run_reference, wait_for
from tests.workers.queue.test_worker_loss import mid_epoch_checkpoint, running_at_step


def rogue(marker, what: str) -> dict:
    return make_spec(model={"target": "tests.rogue:channel_writer",
                            "kwargs": {"marker": str(marker), "at_forward": 3, "what": what}},
                     loop={"epochs": 2}, scheduler={"name": "none"})


@pytest.mark.slow
@pytest.mark.quick
def test_a_pickle_or_a_forged_message_from_the_jobs_code_is_refused_and_the_worker_goes_on(cluster, tmp_path):
    worker, = cluster.start_workers(1)
    marker = tmp_path / "the-worker-ran-the-jobs-code"
    pickled = cluster.client.submit(rogue(marker, "pickle"), "pickled")
    forged = cluster.client.submit(rogue(tmp_path / "unused", "forged"), "forged")
    honest = cluster.client.submit(make_spec(loop={"epochs": 1}), "honest")

    for job, why in ((pickled, "not a message of the channel's"), (forged, "tell on_step: ")):
        final = job.wait(timeout=120, progress=False)
        assert final.state.value == "failed" and final.attempt == 1, final
        assert final.error.startswith("ChannelRefused: the training process sent its worker a message it may not "
                                      f"send ({why}"), final.error
        assert "the job's code wrote into baton's channel" in final.error
    assert not marker.exists()  # the pickle was never loaded

    final = honest.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded", final.error
    assert final.worker == worker.name and worker.proc.poll() is None  # the same worker process, unharmed
    assert worker.log().count("a message it may not send: ") == 2  # its own line for each, then it went on


@pytest.mark.slow
def test_the_store_a_jobs_code_finds_in_its_process_reaches_no_other_jobs_objects(cluster, tmp_path):
    cluster.start_workers(1)
    victim = cluster.client.submit(make_spec(loop={"epochs": 1}), "victim")
    assert victim.wait(timeout=120, progress=False).state.value == "succeeded"
    store = cluster.store()
    before = {key: store.get_bytes(key) for key in store.list("jobs/victim/")}
    report = tmp_path / "report.json"
    spec = make_spec(model={"target": "tests.rogue:store_prober", "kwargs": {"report": str(report), "victim": "victim"}},
                     loop={"epochs": 1})
    final = cluster.client.submit(spec, "prober").wait(timeout=120, progress=False)
    assert final.state.value == "succeeded", final.error  # it trained, checkpointed and finished through its gate

    found = json.loads(report.read_text())
    assert found.pop("stores") == ["GatedStore"]  # the only store in its process: its worker's gate
    assert len(found) == 8 and set(found.values()) == {"OutsideJob"}, found
    assert {key: store.get_bytes(key) for key in store.list("jobs/victim/")} == before
    assert not store.list("jobs/victim-stolen/")


@pytest.mark.slow
def test_a_jobs_code_finds_none_of_the_pools_credentials_in_its_environment(cluster, tmp_path):
    key_id, secret = f"pool-key-{tmp_path.name}", f"pool-secret-{tmp_path.name}-0123456789"
    cluster.start_workers(1, AWS_ACCESS_KEY_ID=key_id, AWS_SECRET_ACCESS_KEY=secret, BATON_JOB_ENV_DROP="TEAM_TOKEN_*",
                          TEAM_TOKEN_A="team-token-abcdefgh")
    report = tmp_path / "report.json"
    looked_for = [key_id, secret, cluster.redis_url, cluster.storage_url, "team-token-abcdefgh"]
    spec = make_spec(model={"target": "tests.rogue:environment_reader",
                            "kwargs": {"report": str(report), "secrets": looked_for}}, loop={"epochs": 1})
    final = cluster.client.submit(spec, "reader").wait(timeout=120, progress=False)
    assert final.state.value == "succeeded", final.error  # it trained and checkpointed without any of them

    assert json.loads(report.read_text()) == {"names": [], "os.environ": [], "own /proc environ": [],
                                              "parent's /proc environ": [], "a process it started": []}


@pytest.fixture
def tenants_pool(tmp_path, monkeypatch, open_dir):
    """Workers in their default (jobs run as a uid of their own per worker), a Redis that asks for a
    password, a file store; and a directory every user may write in (a prober's one way out)."""
    monkeypatch.setenv("BATON_ALLOWED_MODULES", "tests")
    server = RedisServer(password=f"pool-{secrets.token_hex(12)}").start()
    store_root = tmp_path / "store"
    env = baton_env(BATON_REDIS_URL=server.url, BATON_STORAGE_URL=store_root.as_uri(), BATON_JOB_USER="",
                    BATON_ACCEPT_CODE="1")
    pool = Cluster(env, tmp_path, server.url, store_root.as_uri())
    yield pool, server, store_root, open_dir
    pool.stop()
    server.stop()


def _every_try_failed(found: dict, uid: int) -> None:
    assert found["uid"] == uid != 0 and found["variables"] == [] and found["passwords found"] == []
    assert len(found["baton processes"]) >= 2, found  # its worker and forkserver at least
    assert {tuple(outcomes) for outcomes in found["baton processes"].values()} == {("PermissionError", "PermissionError")}
    assert found["signal"] == {"forkserver": "PermissionError", "worker": "PermissionError"}
    assert found["redis without a password"] == "AuthenticationError"
    assert found["s3 with the credentials found"] == "NoCredentialsError"
    assert set(found["file store"].values()) == {"PermissionError"}, found["file store"]
    assert found["code cache"] == {"entries": 1, "write its own entry": "PermissionError", "change a file": "PermissionError",
                                   "list the cache": "PermissionError", "write the cache": "PermissionError"}
    assert found["venv"] == {"site-packages": "PermissionError", "baton": "PermissionError"}
    assert any(name.startswith("baton-memory-") for name in found["other jobs' /dev/shm"]), found  # the victim's
    assert {tuple(outcomes) for outcomes in found["other jobs' /dev/shm"].values()} == {("PermissionError",) * 2}


@pytest.mark.slow
def test_a_job_as_its_own_user_reaches_nothing_of_its_worker_or_of_another_job_and_resumes_bit_exact(tenants_pool, tmp_path):
    pool, redis_server, store_root, way_out = tenants_pool
    pool.start_workers(2)
    victim = pool.client.submit(make_spec(loop={"epochs": 400}), "victim")  # holding copies in memory meanwhile
    victims_worker = wait_for(running_at_step(victim, 5)).worker
    code = tmp_path / "code"
    code.mkdir()
    (code / "shipped_note.py").write_text("NOTE = 'shipped with the job'\n")
    model = {"target": "tests.rogue:tenant_prober",
             "kwargs": {"redis_port": redis_server.port, "store_root": str(store_root), "victim": "victim"}}
    reference = run_reference(tmp_path / "reference", make_spec(model=model, scheduler={"name": "none"}))
    spec = make_spec(model={**model, "kwargs": {**model["kwargs"], "report_dir": str(way_out)}},
                     scheduler={"name": "none"}, code={"dir": str(code)})
    job = pool.client.submit(spec, "tenant")
    holder = pool.worker(wait_for(running_at_step(job, 1)).worker)
    assert holder.name != victims_worker
    report = way_out / "report.json"
    committed = kill_when(holder.proc, pool.store(), "tenant", lambda m: mid_epoch_checkpoint(m) and report.exists())
    assert victim.cancel()
    planted_in_redis = redis.Redis.from_url(pool.redis_url).exists("stolen")

    found = json.loads(report.read_text())
    uid = found["forward"]["uid"]
    assert found["loader worker"].pop("in a loader worker") is True
    assert found["loader worker"]["pid"] != found["forward"]["pid"]
    for where in ("forward", "loader worker"):
        _every_try_failed(found[where], uid)
    assert not planted_in_redis
    assert not (store_root / "jobs" / "victim" / "planted").exists()

    final = job.wait(timeout=180, progress=False)
    assert final.state.value == "succeeded", final.error
    assert (final.attempt, final.lost) == (2, 1) and final.worker == victims_worker
    assert final.resumed_from == committed["checkpoints"][-1]["step"]
    assert_same_training(reference, "reference", pool.store(), "tenant")

