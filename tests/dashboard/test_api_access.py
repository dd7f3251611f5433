"""Who may do what, tried over plain HTTP by a stranger: every action without the token, with a wrong
one, from another site, or through a rebound host name is refused and changes nothing; a dashboard
started without a token refuses every action; the pages load nothing from another origin."""
from __future__ import annotations

import re

from tests.dashboard.conftest import TOKEN, start_dashboard, stop
from tests.helpers import REPO, make_spec, run_baton

QUEUED = make_spec(resources={"queue": "nobody-serves", "device": "cpu", "cpu_threads": 1})
ACTIONS = (("POST", "/api/jobs/held/cancel", None), ("POST", "/api/jobs/held/resume", None),
           ("POST", "/api/jobs/held/priority", {"priority": 7}), ("POST", "/api/workers/someone/drain", None))


def _unchanged(cluster) -> None:
    status = cluster.client.job("held").status()
    assert status.state.value == "queued" and status.priority == 0, status


def test_a_stranger_cannot_act_and_reads_change_nothing(cluster, dashboard):
    cluster.client.submit(QUEUED, "held")
    for method, path, body in ACTIONS:
        for token, headers in ((None, {}), ("wrong-token", {}), ("", {}), (TOKEN.upper(), {}),
                               (TOKEN, {"Origin": "http://evil.example"})):
            status, answer = dashboard.call(method, path, body, token=token, headers=headers)
            assert status == 403, (path, token, headers, status, answer)
        _unchanged(cluster)
    status, answer = dashboard.call("GET", "/api/jobs", headers={"Host": "evil.example:8265"})
    assert status == 421, answer  # DNS rebinding: a page of another site reaching 127.0.0.1 by its own name
    status, answer = dashboard.call("POST", "/api/jobs/held/cancel", token=TOKEN, headers={"Host": "evil.example"})
    assert status == 421
    _unchanged(cluster)


def _listed_state(dashboard, job_id: str) -> str:
    return next(job["state"] for job in dashboard.get("/api/jobs")["jobs"] if job["id"] == job_id)


def test_the_token_allows_each_action(cluster, dashboard):
    cluster.client.submit(QUEUED, "held")
    assert _listed_state(dashboard, "held") == "queued"
    status, answer = dashboard.call("POST", "/api/jobs/held/priority", {"priority": 7}, token=TOKEN)
    assert status == 200 and cluster.client.job("held").status().priority == 7, answer
    waiting = cluster.client.queue("nobody-serves")[0].state.waiting
    assert [(w.job_id, w.priority) for w in waiting] == [("held", 7)]  # its line moved with the record
    for bad in ({"priority": "high"}, {"priority": True}, {"priority": 10**12}, {}):
        status, _ = dashboard.call("POST", "/api/jobs/held/priority", bad, token=TOKEN)
        assert status == 422, bad
    status, answer = dashboard.call("POST", "/api/jobs/held/cancel", token=TOKEN, headers={"Origin": dashboard.url})
    assert status == 200 and answer["result"] == "cancelled"
    assert _listed_state(dashboard, "held") == "cancelled"  # the listing's kept rows follow the record
    status, answer = dashboard.call("POST", "/api/jobs/held/resume", token=TOKEN)
    assert status == 200 and cluster.client.job("held").status().state.value == "retrying", answer
    assert _listed_state(dashboard, "held") == "retrying"  # a finished row kept, then unfinished again
    done = run_baton("priority", "held", "3", env=cluster.env)
    assert done.returncode == 0 and cluster.client.job("held").status().priority == 3, done.stderr
    assert dashboard.call("POST", "/api/jobs/nosuch/cancel", token=TOKEN)[0] == 404
    assert dashboard.call("POST", "/api/workers/nosuch/drain", token=TOKEN)[0] == 404
    kinds = [e["kind"] for e in dashboard.get("/api/jobs/held")["timeline"]]
    assert kinds == ["submitted", "priority", "cancelled", "requeued", "priority"], kinds


def test_without_a_token_the_dashboard_is_read_only(cluster):
    cluster.client.submit(QUEUED, "held")
    board = start_dashboard(cluster.env, cluster.log_dir / "ui.log", None)
    try:
        assert board.get("/api/info")["actions"] is False
        for method, path, body in ACTIONS:
            status, answer = board.call(method, path, body, token=TOKEN)
            assert status == 403 and "read-only" in answer["detail"], answer
        _unchanged(cluster)
        assert [j["id"] for j in board.get("/api/jobs")["jobs"]] == ["held"]
    finally:
        stop(board.proc)


def test_the_pages_load_nothing_from_another_origin_and_forbid_framing(dashboard):
    for page in ("/", "/queue", "/workers", "/jobs/x"):
        status, html = dashboard.call("GET", page)
        assert status == 200
        sources = re.findall(rb'(?:src|href)="([^"]+)"', html)
        assert sources and all(s.startswith(b"/") or s.startswith(b"data:") for s in sources), sources
    import urllib.request

    with urllib.request.urlopen(dashboard.url + "/") as response:
        assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
        assert response.headers["X-Frame-Options"] == "DENY"
    for path in (REPO / "dashboard" / "static").glob("*.js"):  # (uPlot names its home page in its licence comment)
        assert not re.search(r"https?://", path.read_text().replace("https://github.com/leeoniya/uPlot", "")), path


def test_baton_ui_says_in_one_line_why_it_cannot_listen(cluster, dashboard):
    port = dashboard.url.rsplit(":", 1)[1]
    done = run_baton("ui", "--port", port, env=cluster.env, timeout=60)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith(f"baton ui: cannot listen on"), \
        done.stderr
    assert "Traceback" not in done.stderr


def test_a_strangers_large_body_is_refused_before_it_is_read_and_bad_values_change_nothing(cluster, dashboard):
    import http.client

    cluster.client.submit(QUEUED, "held")
    host, port = dashboard.url.split("//")[1].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.putrequest("POST", "/api/jobs/held/priority")  # says 50 MB are coming, sends none of them:
    connection.putheader("Content-Length", str(50_000_000))  # the answer comes before anything is read
    connection.putheader("Content-Type", "application/json")
    connection.endheaders()
    assert connection.getresponse().status == 413
    connection.close()
    for body in ({"drained": "false"}, {"drained": 0}):
        assert dashboard.call("POST", "/api/workers/w/drain", body, token=TOKEN)[0] == 422
    assert dashboard.call("GET", "/api/jobs?sort=bogus")[0] == 422
    assert [j["id"] for j in dashboard.get("/api/jobs?state=")["jobs"]] == ["held"]  # an empty filter is none
    _unchanged(cluster)


def test_the_dashboard_reads_only_its_own_store_and_survives_a_malformed_one(cluster, dashboard, tmp_path):
    from baton.jobs.client import JobClient
    from baton.storage.stores.open import open_store

    elsewhere = tmp_path / "chosen-by-the-submitter"
    JobClient(cluster.redis_url, f"file://{elsewhere}").submit(QUEUED, "elsewhere")
    import shutil

    shutil.rmtree(elsewhere)
    detail = dashboard.get("/api/jobs/elsewhere")
    assert detail["store_note"] and detail["checkpoints"] == [] and not elsewhere.exists()
    assert dashboard.get("/api/jobs/elsewhere/log")["text"] == "" and not elsewhere.exists()

    open_store(cluster.storage_url).put_bytes("jobs/bad-1/spec.json", b'{"name": {"a": 1}, "resources": "x"}')
    listed = wait_for_listed(dashboard, "bad-1")
    assert listed["name"] is None and listed["state"] == "stored"
    assert dashboard.call("GET", "/api/jobs/bad-1")[0] == 200
    assert dashboard.get("/api/info")["history_error"] is None


def wait_for_listed(dashboard, job_id: str) -> dict:
    from tests.dashboard.conftest import wait_for

    return wait_for(lambda: next((j for j in dashboard.get("/api/jobs")["jobs"] if j["id"] == job_id), None), 30,
                    f"{job_id} in the listing")


def test_redaction_leaves_ids_and_links_whole_and_hides_a_secret_a_spec_names_as_a_name(monkeypatch):
    """With the docs' S3 secret (``test``) 'latest' stays 'latest' (its download link was broken as 'la***');
    a secret in the user's own spec is hidden whatever its key is called."""
    from baton.dashboard.access import Access

    token = "tok-abcdef123456"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("MY_API_TOKEN", token)
    cleaned = Access(None, []).clean({
        "status": {"id": "test", "latest_checkpoint": "jobs/test/attempt-1/checkpoints/step-4.pt", "error": "key test"},
        "artifacts": [{"which": "latest", "file": "test-latest-step4.pt"}],
        "spec": {"model": {"kwargs": {"name": token, "key": token, "id": token}}}})
    assert cleaned["status"]["id"] == "test" and cleaned["artifacts"][0] == {"which": "latest", "file": "test-latest-step4.pt"}
    assert cleaned["status"]["latest_checkpoint"] == "jobs/test/attempt-1/checkpoints/step-4.pt"
    assert cleaned["status"]["error"] == "key ***" and token not in str(cleaned["spec"])
