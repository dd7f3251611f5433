"""Two ``baton server`` processes behind one Redis: a token rotated through one is refused by the other
from the moment the rotation returns (each request looks its token up in Redis: no server caches it),
and a user removed by the operator is refused by both."""
from __future__ import annotations

import time

from tests.dashboard.conftest import start_server, stop
from tests.dashboard.test_server_roles import pool  # noqa: F401 - the first server and its users' tokens
from tests.helpers import run_baton


def test_a_token_rotated_on_one_server_is_refused_by_another_at_once(cluster, pool):  # noqa: F811
    first, tokens = pool
    second = start_server(cluster.env, cluster.log_dir / "second.log")
    try:
        old = tokens["ada"]
        assert second.call("GET", "/api/whoami", token=old)[1]["name"] == "ada"
        status, answer = first.call("POST", "/api/users/ada/token", token=tokens["root"])
        rotated_at = time.monotonic()
        assert status == 200, answer
        refused = second.call("GET", "/api/whoami", token=old)
        took = time.monotonic() - rotated_at
        assert refused[0] == 401 and took < 1.0, (refused, took)
        assert second.call("GET", "/api/whoami", token=answer["token"])[1]["name"] == "ada"
        assert first.call("GET", "/api/whoami", token=old)[0] == 401

        assert run_baton("users", "rm", "ada", env=cluster.env).returncode == 0
        for server in (first, second):
            assert server.call("GET", "/api/jobs", token=answer["token"])[0] == 401
    finally:
        stop(second.proc)
