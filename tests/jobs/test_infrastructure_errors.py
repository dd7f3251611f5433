"""A wrong Redis URL, bucket, credentials, endpoint or store path: every command answers in one line
naming what failed, exit 5, no traceback (``baton --debug`` shows it). Real redis-server, moto's S3
server, and a gateway in front of it that refuses unknown access keys as S3 does."""
from __future__ import annotations

import pytest

from tests.helpers import baton_env, make_spec, run_baton, write_spec
from tests.s3_gateway import S3Gateway

EXIT_INFRASTRUCTURE = 5


@pytest.fixture
def place(redis_server, s3_server, s3_bucket, tmp_path):
    """A spec, and the environment of a working set-up (its Redis, bucket and credentials)."""
    import redis

    redis.Redis.from_url(redis_server.url).flushdb()
    env = dict(s3_server.env(), BATON_REDIS_URL=redis_server.url, BATON_STORAGE_URL=f"s3://{s3_bucket}/runs")
    return write_spec(tmp_path, make_spec(loop={"epochs": 1})), env


def _one_line(args: list[str], env: dict, *named: str) -> str:
    result = run_baton(*args, env=baton_env(**env))
    said = (result.stdout + result.stderr).strip()
    assert result.returncode == EXIT_INFRASTRUCTURE, said
    assert "Traceback" not in said and len(said.splitlines()) == 1, said
    for part in named:
        assert part in said, said
    return said


@pytest.mark.slow
def test_a_wrong_redis_url(place):
    spec, env = place
    env = dict(env, BATON_REDIS_URL="redis://:hunter22hunter@127.0.0.1:1/0")
    for args in (["submit", str(spec)], ["status"], ["status", "j"], ["fetch", "j", "-o", "out"], ["cancel", "j"]):
        said = _one_line(args, env, "cannot use Redis at redis://", "127.0.0.1:1", "BATON_REDIS_URL")
        assert "hunter22hunter" not in said  # the URL's password is not printed


@pytest.mark.parametrize("variable,value,said", [
    ("BATON_REDIS_URL", "localhost:6379", "BATON_REDIS_URL: must be redis://HOST:PORT/DB"),  # no scheme
    ("BATON_REDIS_URL", "redis://[::1", "Invalid IPv6 URL"),
    ("BATON_STORAGE_URL", "gs://bucket/runs", "BATON_STORAGE_URL: must start with s3:// or file://"),
])
def test_a_setting_that_is_not_a_url_of_its_kind(place, variable, value, said):
    spec, env = place
    env = dict(env, **{variable: value})
    for args in (["submit", str(spec)], ["status"], ["fetch", "j", "-o", "out"], ["cancel", "j"], ["queue"],
                 ["health"], ["run", str(spec), "--id", "r"], ["worker"]):
        _one_line(args, env, said)


def test_a_bucket_that_does_not_exist(place, tmp_path):
    spec, env = place
    env = dict(env, BATON_STORAGE_URL="s3://no-such-bucket/runs")
    for args in (["submit", str(spec)], ["run", str(spec), "--id", "r"]):
        _one_line(args, env, "s3://no-such-bucket/runs", "the bucket does not exist", "BATON_STORAGE_URL")


@pytest.mark.slow
def test_credentials_the_store_refuses(place, s3_server, tmp_path):
    spec, env = place
    gateway = S3Gateway(s3_server.port, access_keys={env["AWS_ACCESS_KEY_ID"]})
    try:
        good = dict(env, AWS_ENDPOINT_URL=gateway.endpoint_url)
        done = run_baton("run", str(spec), "--id", "r", env=baton_env(**good))
        assert done.returncode == 0, done.stderr  # the gateway passes the right key through
        wrong = dict(good, AWS_ACCESS_KEY_ID="AKIANOTAKEYATALL")
        for args in (["submit", str(spec)], ["run", str(spec), "--id", "r2"],
                     ["fetch", "r", "--storage", good["BATON_STORAGE_URL"], "-o", str(tmp_path / "out")]):
            said = _one_line(args, wrong, "refused the credentials", "access denied", "check the AWS credentials")
            assert "baton logs" not in said  # (no pointing at a log the store would not take)
    finally:
        gateway.close()


def test_no_credentials_at_all(place, tmp_path, monkeypatch):
    spec, env = place
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
        env.pop(name, None)
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true")  # (no instance to ask here; on one, its role is credentials)
    for args in (["submit", str(spec)], ["logs", "j"]):
        _one_line(args, env, "no AWS credentials found", "AWS_ACCESS_KEY_ID")


@pytest.mark.slow
def test_an_endpoint_that_is_down(place):
    from baton.jobs.services import free_port

    spec, env = place
    env = dict(env, AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}")
    for args in (["submit", str(spec)], ["run", str(spec), "--id", "r"]):
        _one_line(args, env, "the store does not answer", "AWS_ENDPOINT_URL")


def test_a_store_path_that_cannot_be_a_directory(place, tmp_path):
    spec, env = place
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = dict(env, BATON_STORAGE_URL=f"file://{blocker}/store")
    for args in (["submit", str(spec)], ["run", str(spec), "--id", "r"], ["recover", "--all"]):
        _one_line(args, env, f"file://{blocker}/store", "cannot be created")


def test_debug_shows_the_traceback(place):
    spec, env = place
    result = run_baton("--debug", "status", env=baton_env(**dict(env, BATON_REDIS_URL="redis://127.0.0.1:1/0")))
    assert result.returncode != 0 and "Traceback" in result.stderr and "ConnectionError" in result.stderr


@pytest.mark.slow
def test_fetch_of_a_baton_run_job_needs_no_redis_and_a_missing_bucket_is_not_no_job(place, tmp_path):
    spec, env = place
    store = f"file://{tmp_path / 'store'}"
    done = run_baton("run", str(spec), "--id", "local", "--storage", store, env=baton_env(**env))
    assert done.returncode == 0, done.stderr
    no_redis = dict(env, BATON_REDIS_URL="redis://127.0.0.1:1/0", BATON_STORAGE_URL=store)
    fetched = run_baton("fetch", "local", "--which", "final", "-o", str(tmp_path / "out"), env=baton_env(**no_redis))
    assert fetched.returncode == 0, fetched.stderr
    assert (tmp_path / "out" / "local").is_dir()
    # a job the store does not hold either: Redis's own line, not "no job"
    _one_line(["fetch", "other", "-o", str(tmp_path / "out")], no_redis, "cannot use Redis at")
    for args in (["fetch", "nojob", "-o", str(tmp_path / "out")],
                 ["fetch", "nojob", "--storage", "s3://no-such-bucket/p", "-o", str(tmp_path / "out")]):
        _one_line(args, dict(env, BATON_STORAGE_URL="s3://no-such-bucket/p"), "the bucket does not exist")


def test_an_endpoint_that_answers_http_but_is_not_s3(place, tmp_path):
    """A wrong port, a proxy, a web server: one line within seconds, not a traceback or 20 s of retries."""
    import http.server
    import threading
    import time

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        spec, env = place
        env = dict(env, AWS_ENDPOINT_URL=f"http://127.0.0.1:{server.server_address[1]}",
                   BATON_STORAGE_URL="s3://bucket1/p")
        for args in (["run", str(spec), "--id", "r"], ["recover", "--all"],
                     ["fetch", "x", "--storage", "s3://bucket1/p", "-o", str(tmp_path / "out")],
                     ["logs", "x", "--storage", "s3://bucket1/p"]):
            started = time.monotonic()
            _one_line(args, env, "AWS_ENDPOINT_URL")
            assert time.monotonic() - started < 10, args  # (generous: the machine may be loaded)
    finally:
        server.shutdown()
