"""Issue 9: an S3-compatible store that ignores conditional writes turns the manifest's
compare-and-swap into a blind overwrite. A worker probes its store at start and refuses to run.

The store that ignores them is moto's server behind tests/s3_gateway.py, which strips
If-None-Match/If-Match from every request, as such stores effectively do."""
from __future__ import annotations

import subprocess

import pytest

from baton.storage.stores.open import open_store

from tests.helpers import baton_env, run_baton
from tests.s3_gateway import S3Gateway
from tests.storage.conftest import store_through


@pytest.fixture
def careless_gateway(s3_server):
    gw = S3Gateway(s3_server.port, ignore_conditions=True)
    yield gw
    gw.close()


def test_the_probe_passes_on_a_store_that_honours_conditions(s3_bucket):
    from baton.storage.conditional_probe import check_conditional_writes

    store = open_store(f"s3://{s3_bucket}/runs")
    check_conditional_writes(store)
    assert store.list("") == []  # the probe cleans up after itself


def test_the_probe_refuses_a_store_that_ignores_conditions(s3_bucket, careless_gateway):
    from baton.schemas.errors import ConditionalWritesIgnored
    from baton.storage.conditional_probe import check_conditional_writes

    store = store_through(careless_gateway, s3_bucket)
    with pytest.raises(ConditionalWritesIgnored) as refused:
        check_conditional_writes(store)
    assert store.url in str(refused.value)


def test_a_worker_refuses_to_start_on_such_a_store(s3_bucket, s3_env, careless_gateway, redis_server):
    url = f"s3://{s3_bucket}/runs"
    env = baton_env(**{**s3_env, "AWS_ENDPOINT_URL": careless_gateway.endpoint_url}, BATON_STORAGE_URL=url,
                    BATON_REDIS_URL=redis_server.url, BATON_METRICS_PORT="0")
    try:
        result = run_baton("worker", "--name", "careless@test", env=env, timeout=45)
    except subprocess.TimeoutExpired:
        pytest.fail("the worker started on a store that ignores conditional writes")
    assert result.returncode == 5  # (an infrastructure mistake, as for every command)
    assert url in result.stderr and "conditional" in result.stderr


@pytest.mark.slow
def test_a_store_briefly_unreachable_at_start_is_waited_for_not_refused(s3_bucket, s3_env, s3_server, monkeypatch):
    """A blip while a worker (or a slot restarted after a stall) starts must not leave it refusing
    to run (exit 2) for good; an outage that outlasts the waits is refused, naming why."""
    import threading

    from baton.workers.queue.worker_main import check_storage

    from tests.netfault import FaultyProxy

    proxy = FaultyProxy(s3_server.port)
    # each store call rides through 20 s of trouble before the probe sees it: 1 s here, or the outage
    # below costs minutes of the suite
    monkeypatch.setattr("baton.storage.stores.s3_store.RETRY_S", 1.0)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
        url = f"s3://{s3_bucket}/runs"
        proxy.set("cut")
        refusal = check_storage(url, waits=(0.2,))
        assert refusal is not None and "storage unreachable" in refusal
        threading.Timer(1.0, proxy.set, args=("pass",)).start()
        assert check_storage(url, waits=(0.5, 0.5, 1.0, 2.0, 4.0)) is None
    finally:
        proxy.close()
