"""The compose file's Redis, run as it is written (its own shell command, on a real redis-server): the ACL
file it writes at start gives each part of baton its own Redis user with the rules docs/security.md gives,
the default user is off, a wrong password is refused, and its health check passes. The other services
connect as the users it makes."""
from __future__ import annotations

import os
import re
import subprocess

import pytest
import redis as redis_lib

from tests.dashboard.conftest import free_port
from tests.deploy.test_manifests import compose
from tests.dashboard.test_server_acl import _acl_lines

PASSWORDS = {"REDIS_SERVER_PASSWORD": "s3rverpw81f2", "REDIS_WORKER_PASSWORD": "w0rkerpw0c9d",
             "REDIS_FLOWER_PASSWORD": "fl0werpw77a1"}
USERS = {"baton-server": "REDIS_SERVER_PASSWORD", "baton-worker": "REDIS_WORKER_PASSWORD",
         "baton-flower": "REDIS_FLOWER_PASSWORD"}


@pytest.fixture
def compose_redis(tmp_path):
    service = compose()["services"]["redis"]
    command = service["command"][2].replace("$$", "$").replace("/tmp/users.acl", str(tmp_path / "users.acl"))
    port = free_port()
    assert "exec redis-server " in command
    command = command.replace("exec redis-server ", f"exec redis-server --port {port} --bind 127.0.0.1 --dir {tmp_path} ")
    proc = subprocess.Popen(["sh", "-c", command], env={**os.environ, **PASSWORDS}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    said = []
    for line in proc.stdout:  # (redis-server says when it listens; its end, EOF: the command failed)
        said.append(line)
        if "Ready to accept connections" in line:
            break
    else:
        raise AssertionError(f"the compose file's redis command exited: {''.join(said)}")
    yield service, port, tmp_path
    proc.terminate()
    proc.wait(timeout=30)


def test_the_compose_redis_gives_each_part_its_own_user_and_no_one_else_gets_in(compose_redis):
    service, port, tmp_path = compose_redis
    for user, password in USERS.items():
        assert redis_lib.Redis(port=port, username=user, password=PASSWORDS[password]).ping()
        with pytest.raises(redis_lib.AuthenticationError):
            redis_lib.Redis(port=port, username=user, password="wrong").ping()
    with pytest.raises((redis_lib.AuthenticationError, redis_lib.ResponseError)):
        redis_lib.Redis(port=port).ping()  # the default user is off
    worker = redis_lib.Redis(port=port, username="baton-worker", password=PASSWORDS["REDIS_WORKER_PASSWORD"])
    with pytest.raises(redis_lib.exceptions.NoPermissionError):
        worker.execute_command("FLUSHALL")  # (-@dangerous)

    # the rules are the ones the docs give (and tests/dashboard/test_server_acl.py runs a pool under)
    documented = {line.split()[2]: line.split()[3:] for line in _acl_lines()}
    written = {line.split()[1]: line.split()[2:] for line in (tmp_path / "users.acl").read_text().splitlines()}
    assert written["default"] == documented["default"] == ["off"]
    rules = documented["baton-worker"][2:]
    assert all(written[user][0] == "on" and written[user][2:] == rules for user in USERS)
    assert documented["baton-server"][2:] == rules

    health = service["healthcheck"]["test"]
    assert health[0] == "CMD-SHELL"
    check = health[1].replace("$$", "$").replace("redis-cli ", f"redis-cli -p {port} ")
    assert subprocess.run(["sh", "-c", check], env={**os.environ, **PASSWORDS}).returncode == 0
    assert subprocess.run(["sh", "-c", check], env={**os.environ, **PASSWORDS, "REDIS_WORKER_PASSWORD": "x"}).returncode


def test_every_service_that_reaches_redis_does_so_as_one_of_its_users():
    services = compose()["services"]
    urls = {name: (service.get("environment") or {}).get("BATON_REDIS_URL") for name, service in services.items()}
    assert urls["worker"].startswith("redis://baton-worker:${REDIS_WORKER_PASSWORD")
    assert urls["server"].startswith("redis://baton-server:${REDIS_SERVER_PASSWORD")
    assert any(re.match(r"--broker=redis://baton-flower:\$\{REDIS_FLOWER_PASSWORD", part)
               for part in services["flower"]["command"])
    assert all(url is None or "@redis:" in url and "://redis:" not in url for url in urls.values())
