"""baton's Celery settings, and a plain `celery -A baton.workers.queue.celery_app worker` running a job."""
from __future__ import annotations

import pytest

import subprocess
import sys

from baton.jobs.services import die_with_parent
from baton.schemas.settings import BatonSettings
from baton.storage.records.messages import make_app
from baton.storage.records.celery_config import celery_settings

from tests.helpers import REPO, make_spec


def test_json_only_late_acks_one_at_a_time_in_the_main_process():
    conf = make_app(BatonSettings(redis_url="redis://127.0.0.1:1/0")).conf
    assert conf.task_serializer == "json" and list(conf.accept_content) == ["json"]
    assert conf.task_acks_late and conf.task_reject_on_worker_lost and conf.worker_prefetch_multiplier == 1
    assert conf.worker_pool == "solo" and conf.result_backend is None


def test_rediss_requires_certificate_verification():
    import ssl

    settings = celery_settings(BatonSettings(redis_url="rediss://:secret@redis.example:6380/0", redis_ca_certs="/ca.pem"))
    assert settings["broker_use_ssl"] == {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": "/ca.pem"}
    assert celery_settings(BatonSettings(redis_url="redis://h:6379/0"))["broker_use_ssl"] is None


@pytest.mark.slow
def test_plain_celery_worker_runs_a_job(cluster, tmp_path):
    log = open(tmp_path / "plain.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "baton.workers.queue.celery_app", "worker", "--hostname", "plain@test",
                             "--loglevel", "INFO"], env=cluster.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=die_with_parent)
    try:
        job = cluster.client.submit(make_spec(loop={"epochs": 1}, scheduler={"name": "none"}), "plain")
        final = job.wait(timeout=90, progress=False)
        assert final.state.value == "succeeded" and final.worker == "plain@test", (tmp_path / "plain.log").read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
