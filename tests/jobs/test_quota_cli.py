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


def test_a_submit_or_quota_for_a_queue_no_worker_serves_says_so(redis_server, tmp_path):
    from tests.helpers import make_spec, write_spec

    redis.Redis.from_url(redis_server.url).flushdb()
    env = baton_env(BATON_REDIS_URL=redis_server.url, BATON_STORAGE_URL=f"file://{tmp_path / 'store'}")
    quota = run_baton("quota", "set", "vision", "--queue", "gpus", "--slots", "1", env=env)
    assert quota.returncode == 0 and "no live worker serves queue 'gpus' now" in quota.stderr, quota.stderr
    submitted = run_baton("submit", str(write_spec(tmp_path, make_spec())), "--set", "resources.queue=gpus", env=env)
    assert submitted.returncode == 0, submitted.stderr
    assert "warning: no live worker serves queue 'gpus' now; the job waits for one" in submitted.stderr
