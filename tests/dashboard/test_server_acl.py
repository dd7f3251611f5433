"""The Redis ACL lines docs/security.md gives, applied to a real redis-server: the pool's server and a worker
each connect as their own Redis user and a job submitted through the server trains to its end, while a
connection without a password (``default`` is off) or with a wrong one is refused by Redis."""
from __future__ import annotations

import re

import pytest
import redis as redis_lib

from baton.jobs.services import RedisServer
from tests.conftest import Cluster
from tests.dashboard.conftest import start_server, stop, wait_for
from tests.helpers import REPO, make_spec, run_baton

PASSWORDS = {"SERVER-PASSWORD": "server-pw-81f2", "WORKER-PASSWORD": "worker-pw-0c9d"}


def _acl_lines() -> list[str]:
    text = (REPO / "docs" / "security.md").read_text()
    lines = re.findall(r"^\s*(ACL SETUSER .+)$", text, re.M)
    assert len(lines) == 3 and lines[-1].strip() == "ACL SETUSER default off", lines
    return [line.strip() for line in lines]


@pytest.fixture
def acl_redis():
    server = RedisServer().start()
    r = redis_lib.Redis.from_url(server.url)
    for line in _acl_lines():
        for name, value in PASSWORDS.items():
            line = line.replace(name, value)
        r.execute_command(*line.split())
    yield server
    server.stop()


def _url(server: RedisServer, user: str, password: str) -> str:
    return f"redis://{user}:{password}@127.0.0.1:{server.port}/0"


def test_the_server_and_a_worker_run_a_job_as_their_own_redis_users(cluster, acl_redis, tmp_path):
    with pytest.raises(redis_lib.AuthenticationError):
        redis_lib.Redis.from_url(acl_redis.url).ping()  # default is off
    with pytest.raises(redis_lib.AuthenticationError):
        redis_lib.Redis.from_url(_url(acl_redis, "baton-worker", "wrong")).ping()

    as_server = {**cluster.env, "BATON_REDIS_URL": _url(acl_redis, "baton-server", PASSWORDS["SERVER-PASSWORD"])}
    as_worker = {**cluster.env, "BATON_REDIS_URL": _url(acl_redis, "baton-worker", PASSWORDS["WORKER-PASSWORD"])}
    added = run_baton("users", "add", "ada", "--team", "vision", env=as_server)
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip()
    workers = Cluster(as_worker, tmp_path, as_worker["BATON_REDIS_URL"], cluster.storage_url)
    server = start_server(as_server, tmp_path / "server.log")
    try:
        workers.start_workers(1)
        status, answer = server.call("POST", "/api/jobs", {"spec": make_spec(resources={"team": "vision"})}, token=token)
        assert status == 200, answer
        state = wait_for(lambda: (s := server.call("GET", f"/api/jobs/{answer['id']}/status", token=token)[1]["state"])
                         in ("succeeded", "failed", "cancelled") and s, 180, "the job to end")
        assert state == "succeeded"
        log = server.log.read_text()
        assert PASSWORDS["SERVER-PASSWORD"] not in log and token not in log
        worker_log = workers.workers[0].log()
        assert "no permissions" not in worker_log and "NOPERM" not in worker_log, worker_log[-2000:]  # (its reaper's INFO)
    finally:
        stop(server.proc)
        workers.stop()
