"""Secrets of a worker's environment stay out of everything shown about a job: the stored log, the
status's error and traceback, the worker's own log; every line of a multi-line secret (a PEM key, a
JSON credential); a URL password holding '@' (user info ends at the last '@', as urlparse and redis-py
read it)."""
from __future__ import annotations

import pytest

from baton.storage.redaction import Redactor
from baton.workers.tracking.mlflow_tracking import shown_uri
from tests.helpers import make_spec
from tests.workers.queue.test_worker_loss import wait_for

PEM = ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n"
       "q0xQ5e0aVb8pL3m2HkQ1wz9R7sT6uY4iO0pA\n-----END PRIVATE KEY-----\n")
CREDENTIAL = '{\n  "type": "service_account",\n  "private_key_id": "0123456789abcdef0123"\n}'
TOKEN = "tok-5ecr3t-value"


def test_every_line_of_a_multi_line_secret_is_redacted():
    redact = Redactor({"MY_PRIVATE_KEY": PEM, "GCP_CREDENTIALS_JSON": CREDENTIAL})
    shown = redact(f"loaded:\n{PEM}and\n{CREDENTIAL}\n")
    for secret in (PEM, CREDENTIAL):
        for line in secret.splitlines():
            if len(line.strip()) >= 4:
                assert line.strip() not in shown, (line, shown)
    assert redact("MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7") == "***"


def test_a_url_password_holding_an_at_sign_is_hidden_whole():
    redact = Redactor({"BATON_REDIS_URL": "redis://:Secret@99@db:6379/0"})
    assert redact("Secret@99") == "***"
    assert redact("redis://:Secret@99@db:6379/0 up") == "redis://:***@db:6379/0 up"
    assert redact("see https://u:p@ss@w0rd@h:1/x then") == "see https://u:***@h:1/x then"
    assert shown_uri("http://user:p@ss@mlflow:5000/api") == "http://mlflow:5000/api"


def test_a_secret_is_redacted_where_it_stands_as_a_value_never_inside_another_word():
    """The docs' S3 credentials are ``test``: 'latest' showed as 'la***' and its link was broken."""
    redact = Redactor({"AWS_SECRET_ACCESS_KEY": "test", "MY_API_TOKEN": TOKEN, "DB_PASSWORD": "hunter2",
                       "TOKENIZERS_PARALLELISM": "false"})
    for kept in ("latest", "contest", "attestation", "hunter22", "shuffle=false", "/jobs/latest/best"):
        assert redact(kept) == kept  # a short secret inside a word is the word's
    assert redact("AWS_SECRET_ACCESS_KEY=test") == "AWS_SECRET_ACCESS_KEY=***"
    assert redact('{"secret": "test"}') == '{"secret": "***"}' and redact("key: test\nnext") == "key: ***\nnext"
    assert redact("test") == "***" and redact("the secret is test; the latest") == "the secret is ***; the latest"
    assert redact("the password is hunter2, --password hunter2") == "the password is ***, --password ***"
    # a long one wherever it appears, glued to other characters too
    for glued in (f"Bearer {TOKEN} sent", f"Bearer{TOKEN}", f"x{TOKEN}y", repr("user=bob\n" + TOKEN), f"({TOKEN})"):
        assert TOKEN not in redact(glued), glued


@pytest.mark.slow
def test_a_secret_quoted_in_a_jobs_exception_is_redacted_in_its_status_and_the_workers_log(cluster):
    worker, = cluster.start_workers(1, MY_API_TOKEN=TOKEN)
    job = cluster.client.submit(make_spec(model={"target": "tests.probes:secret_quoting", "kwargs": {}}), "quoted")
    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "failed"
    assert final.error == "RuntimeError: login refused for token ***"
    assert "login refused for token ***" in final.traceback and TOKEN not in final.traceback
    wait_for(lambda: "login refused" in worker.log(), timeout=30)
    assert TOKEN not in worker.log() and TOKEN not in job.logs()
