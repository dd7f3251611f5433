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


def test_quota_set_says_which_queue_without_queue_and_warns_of_a_team_nobody_named(redis_server, tmp_path):
    from tests.helpers import make_spec, write_spec

    redis.Redis.from_url(redis_server.url).flushdb()
    env = baton_env(BATON_REDIS_URL=redis_server.url, BATON_STORAGE_URL=f"file://{tmp_path / 'store'}")
    submitted = run_baton("submit", str(write_spec(tmp_path, make_spec())), "--set", "resources.team=vision", env=env)
    assert submitted.returncode == 0, submitted.stderr
    quota = run_baton("quota", "set", "vison", "--slots", "2", env=env)  # misspelt
    assert quota.returncode == 0
    assert quota.stdout.strip() == "team vison: 2 slot(s) of queue default (no --queue given: the queue named default)"
    assert "no job or quota has named team 'vison' yet (misspelled? known teams: vision)" in quota.stderr, quota.stderr
    quota = run_baton("quota", "set", "vision", "--queue", "default", "--slots", "2", env=env)
    assert quota.stdout.strip() == "team vision: 2 slot(s) of queue default" and "named team" not in quota.stderr


def test_a_worker_without_a_store_of_its_own_says_so_and_refuses_where_the_pool_names_a_shared_one(redis_server,
                                                                                                      tmp_path):
    from baton.storage.records import keys

    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    client.sadd(keys.STORES, "s3://team-bucket/runs")  # (as a submit to that store records it)
    env = baton_env(BATON_REDIS_URL=redis_server.url)  # BATON_STORAGE_URL unset
    done = run_baton("worker", "--name", "nostore", env=env, timeout=60)
    assert done.returncode == 5, done.stderr
    assert done.stderr.splitlines() == [
        "baton: BATON_STORAGE_URL is not set; using the default store file://./baton-data (a directory of this machine)",
        "baton worker: this pool's jobs are stored in s3://team-bucket/runs: set BATON_STORAGE_URL to the store this "
        "worker should use (the default is a directory of this machine)"], done.stderr
