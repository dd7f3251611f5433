"""baton quota set/list/rm against a real Redis: what is set is listed with the slots in use, removed
once (a second rm exits 1), and a team or queue that is not a name is refused in one line, exit 2."""
from __future__ import annotations

import redis

from tests.helpers import baton_env, run_baton


def test_quota_set_list_rm_and_a_bad_name(redis_server, tmp_path):
    redis.Redis.from_url(redis_server.url).flushdb()
    env = baton_env(BATON_REDIS_URL=redis_server.url, BATON_STORAGE_URL=f"file://{tmp_path}")
    assert run_baton("quota", "set", "vision", "--queue", "gpu", "--slots", "4", env=env).returncode == 0
    listed = run_baton("quota", "list", env=env)
    assert listed.stdout.split("\n")[1].split() == ["gpu", "vision", "4", "0"], listed.stdout
    assert run_baton("quota", "rm", "vision", "--queue", "gpu", env=env).returncode == 0
    again = run_baton("quota", "rm", "vision", "--queue", "gpu", env=env)
    assert again.returncode == 1 and "has no quota" in again.stderr
    bad = run_baton("quota", "set", "a/b", "--slots", "1", env=env)
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "TEAM: 'a/b' is not a name (letters, digits, '.', '_', '-'; at most 64)"), bad.stderr
    assert "no quotas" in run_baton("quota", "list", env=env).stdout
