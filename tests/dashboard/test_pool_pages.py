"""The queue, workers and jobs pages in a real browser: positions and reasons as `baton queue` says
them, a cancel that needs the token (refused with 403 without it, and nothing changes), a job run with
`baton run` shown from its store alone, and a credential quoted by a job's error shown redacted."""
from __future__ import annotations

import pytest

import re

from tests.dashboard.conftest import TOKEN, screenshot, wait_for
from tests.helpers import make_spec, run_baton, write_spec

LONG = make_spec(loop={"epochs": 400}, checkpoint={"every_steps": 200, "min_interval_s": 1})  # (spaced: 400 short epochs)
SHORT = make_spec(loop={"epochs": 1})


def _queue_rows(browser, queue: str) -> list[list[str]]:
    return browser.execute_script(
        "return [...document.querySelectorAll(`table.waiting[data-queue='${arguments[0]}'] tbody tr`)]"
        ".map((r) => [r.dataset.id, ...[...r.cells].map((c) => c.innerText)])", queue)


def _cli_rows(env) -> list[list[str]]:
    done = run_baton("queue", "--queue", "pool", env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("waiting, in the order they will start:")[1].split("\n\n")[0].strip().splitlines()[1:]
    return [re.split(r"\s{2,}", line.strip()) for line in lines]


@pytest.mark.slow
def test_the_queue_page_matches_baton_queue_and_a_cancel_needs_the_token(cluster, dashboard, browser):
    cluster.start_workers(1, queues="pool")
    client = cluster.client
    client.set_quota("a", "pool", 1)
    running = client.submit({**LONG, "resources": {**LONG["resources"], "queue": "pool", "team": "a"}}, "hog")
    wait_for(lambda: running.status().state.value == "running", 120, "the first job to run")
    for job_id, team, priority in (("low", "b", 0), ("urgent", "b", 5), ("also-a", "a", 0)):
        client.submit({**SHORT, "resources": {**SHORT["resources"], "queue": "pool", "team": team,
                                               "priority": priority}}, job_id)
    browser.get(f"{dashboard.url}/queue")
    wait_for(lambda: len(_queue_rows(browser, "pool")) == 3, 30, "three waiting jobs on the page")
    page = [[row[1], row[0], row[6]] for row in _queue_rows(browser, "pool")]  # position, id, reason
    cli = [[row[0], row[1], row[5]] for row in _cli_rows(cluster.env)]
    assert page == cli, (page, cli)
    # priority first; then team a (at its quota of 1) before team b (1 over its none, once urgent starts)
    assert [row[1] for row in page] == ["urgent", "also-a", "low"]
    screenshot(browser, "queue")

    browser.get(f"{dashboard.url}/jobs/low")
    wait_for(lambda: browser.execute_script("return !document.getElementById('cancel').hidden"), 30, "the cancel button")
    browser.find_element("id", "cancel").click()  # no token given: refused
    said = wait_for(lambda: browser.find_element("id", "action-result").text, 10, "the answer")
    assert said.startswith("403"), said
    assert client.job("low").status().state.value == "queued"
    status, body = dashboard.call("POST", "/api/jobs/low/cancel", token="not-the-token")
    assert status == 403 and client.job("low").status().state.value == "queued", body

    browser.find_element("id", "token").send_keys(TOKEN + "\n")
    browser.find_element("id", "cancel").click()
    wait_for(lambda: client.job("low").status().state.value == "cancelled", 10, "the cancel")
    # (the page shows the answer after Redis has it: wait for the text, not only the record)
    wait_for(lambda: "cancelled" in browser.find_element("id", "action-result").text, 10, "the page's answer")
    client.job("hog").cancel()


@pytest.mark.slow
def test_the_workers_page_shows_each_worker_and_its_job(cluster, dashboard, browser):
    (worker,) = cluster.start_workers(1)
    job = cluster.client.submit(LONG, "busy")
    wait_for(lambda: job.status().state.value == "running", 120, "the job to run")
    browser.get(f"{dashboard.url}/workers")
    row = wait_for(lambda: browser.execute_script(
        "const r = document.querySelector(`tr[data-name='${arguments[0]}']`); return r && r.innerText", worker.name),
        30, "the worker's row")
    assert "alive" in row and "busy" in row and "default" in row, row
    screenshot(browser, "workers")
    job.cancel()


@pytest.mark.slow
def test_a_baton_run_job_shows_from_its_store_alone(cluster, dashboard, browser):
    path = write_spec(cluster.log_dir, make_spec(loop={"epochs": 2}, checkpoint={"every_steps": 10}))
    ran = run_baton("run", str(path), "--id", "solo", "--storage", cluster.storage_url, env=cluster.env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    # (a scan of the store that read the job while it ran lists it as stored: the next one reads it again)
    listed = wait_for(lambda: [j for j in dashboard.get("/api/jobs")["jobs"] if j["id"] == "solo" and j["state"] == "succeeded"],
                      30, "the job listed as succeeded")
    assert listed[0]["source"] == "store"
    browser.get(f"{dashboard.url}/jobs/solo")
    wait_for(lambda: browser.execute_script(
        "const f = document.querySelector(\"[data-fact='record']\"); return f && f.innerText.includes('store only')"),
        30, "the store-only page")
    points = wait_for(lambda: int(browser.execute_script(
        "return document.getElementById('loss').dataset.trainPoints || '0'")), 30, "the curve")
    assert points > 0
    assert browser.execute_script("return document.querySelector(\"#artifacts a[data-which='best']\") !== null")
    screenshot(browser, "store-only-job")


@pytest.mark.slow
def test_a_credential_quoted_by_a_job_error_never_reaches_a_page(cluster, browser):
    from tests.dashboard.conftest import start_dashboard, stop

    secret = "hunter2-credential-0451"
    env = {**cluster.env, "MY_API_TOKEN": secret}
    cluster.env = env
    cluster.start_workers(1)
    board = start_dashboard(env, cluster.log_dir / "ui.log")
    try:
        spec = make_spec(model={"target": "tests.probes:secret_quoting", "kwargs": {}})
        job = cluster.client.submit(spec, "leaky")
        assert job.wait(timeout=120, progress=False).state.value == "failed"
        for path in ("/api/jobs", "/api/jobs/leaky", "/api/jobs/leaky/log", "/api/queue", "/api/workers"):
            status, body = board.call("GET", path)
            assert status == 200 and secret not in str(body), path
        browser.get(f"{board.url}/jobs/leaky")
        text = wait_for(lambda: browser.execute_script(
            "const f = document.querySelector(\"[data-fact='error']\"); return f && document.body.innerText"),
            30, "the error on the page")
        assert "login refused for token ***" in text and secret not in text
        screenshot(browser, "redacted-error")
    finally:
        stop(board.proc)
