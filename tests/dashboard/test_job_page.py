"""A job's page in a real browser, against real workers: the curve grows while the job trains (no
reload: through a SIGKILL and the resume), a SIGKILLed worker shows in the timeline as a loss and a resume, and the finished job's best
weights download from the page, byte for byte those of the store."""
from __future__ import annotations

import hashlib

import pytest

from baton.storage.artifacts import final_files, read_verified
from baton.storage.layout import JobPaths
from baton.storage.manifest_store import ManifestStore
from tests.dashboard.conftest import screenshot, start_dashboard, stop, wait_for
from tests.helpers import kill_when, make_spec, metrics_rows

SPEC = make_spec(name="spiral-mlp", data={"target": "tests.probes:slow_spiral",
                                          "kwargs": {"n_per_class": 2000, "delay_s": 0, "hold_after": 6000}},
                 loop={"epochs": 12}, checkpoint={"every_steps": 40})
# its first attempt trains one epoch (4,800 + 1,200 samples), then waits while the test's hold file exists: a
# page slower than the job (a loaded machine) cannot let it finish before the kill is armed


def _points(browser) -> int:
    return int(browser.execute_script("return document.getElementById('loss').dataset.trainPoints || '0'"))


def _fact(browser, name: str) -> str:
    return browser.execute_script(f"const f = document.querySelector(\"[data-fact='{name}']\"); return f ? f.innerText : ''")


def _timeline(browser) -> list[tuple[str, str]]:
    """(kind, the row's text) of each timeline row, read at once (the page redraws them every 2 s)."""
    return [tuple(row) for row in browser.execute_script(
        "return [...document.querySelectorAll('#timeline tbody tr')].map((r) => [r.dataset.kind, r.innerText])")]


def _kinds(browser) -> list[str]:
    return [kind for kind, _ in _timeline(browser)]


def _mid_run_checkpoint(manifest: dict) -> bool:
    return bool(manifest["checkpoints"]) and manifest["checkpoints"][-1]["kind"] == "step" and not manifest["completed"]


@pytest.fixture
def dashboard(cluster):
    """The dashboard with the docs' own S3 credentials (``test``, which the endpoint takes as any other): a
    secret that is also part of words (``latest``) is never masked in them, nor in links."""
    board = start_dashboard({**cluster.env, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"},
                            cluster.log_dir / "ui.log")
    yield board
    stop(board.proc)


@pytest.mark.slow
def test_a_job_page_follows_training_a_kill_and_the_resume_and_downloads_the_best_weights(cluster, dashboard, browser,
                                                                                          tmp_path):
    hold = tmp_path / "hold"
    hold.touch()
    spec = {**SPEC, "data": {**SPEC["data"], "kwargs": {**SPEC["data"]["kwargs"], "hold": str(hold)}}}
    cluster.start_workers(2)
    job = cluster.client.submit(spec, "watched")
    browser.get(f"{dashboard.url}/jobs/watched")
    browser.execute_script("window.sameDocument = true")
    wait_for(lambda: "running" in _fact(browser, "state") and _points(browser) > 0, 120, "the page to show training")
    first = _points(browser)
    screenshot(browser, "job-running")

    running = wait_for(lambda: job.status().worker, 30, "the job's worker")
    killed_at = kill_when(cluster.worker(running).proc, cluster.store(), "watched", _mid_run_checkpoint,
                          armed=hold.unlink)  # (its epoch 2 goes on only now: killed at its first step checkpoint)
    wait_for(lambda: "resumed" in _kinds(browser), 120, "the timeline to show the resume")
    wait_for(lambda: _points(browser) > first, 60, "more points without a reload")
    assert browser.execute_script("return window.sameDocument === true"), "the page reloaded"
    rows = _timeline(browser)
    kinds = [kind for kind, _ in rows]
    assert kinds.index("lost") < len(kinds) - 1 - kinds[::-1].index("claimed") < kinds.index("resumed"), kinds
    resumed = rows[kinds.index("resumed")][1]
    assert f"step {killed_at['checkpoints'][-1]['step']}" in resumed, resumed
    claimed_again = [text for kind, text in rows if kind == "claimed"][-1]
    assert " s (lost)" in claimed_again, claimed_again  # how long the job was without a worker
    screenshot(browser, "job-resumed")

    assert job.wait(timeout=300, progress=False).state.value == "succeeded"
    wait_for(lambda: "succeeded" in _fact(browser, "state"), 60, "the page to show the job succeeded")
    href, name = wait_for(lambda: browser.execute_script(
        "const a = document.querySelector(\"#artifacts a[data-which='best']\"); return a && [a.href, a.innerText]"),
        30, "the best weights' link")
    assert name.endswith("best.safetensors"), name
    digest = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch(arguments[0]).then((r) => r.arrayBuffer()).then((b) => crypto.subtle.digest("SHA-256", b))
          .then((d) => done([...new Uint8Array(d)].map((x) => x.toString(16).padStart(2, "0")).join("")));
    """, href)
    store = cluster.store()
    best = read_verified(store, final_files(ManifestStore(store, JobPaths("watched")).read())["best.safetensors"])
    assert digest == hashlib.sha256(best).hexdigest()
    links = browser.execute_script("return [...document.querySelectorAll('#artifacts a')].map((a) => "
                                   "[a.dataset.which, a.href, a.innerText])")
    assert {"best", "latest"} <= {which for which, _, _ in links} and "***" not in str(links), links
    for _, link, _ in links:  # every link downloads (one masked as la***/ gave 404)
        assert browser.execute_async_script("const done = arguments[arguments.length - 1];"
                                            "fetch(arguments[0]).then((r) => done(r.status));", link) == 200, link
    assert "latest" in browser.find_element("id", "checkpoints").text
    rows = metrics_rows(store, "watched")  # the learning rate is drawn step by step, not at the validations alone
    lr_points = wait_for(lambda: int(browser.execute_script("return document.getElementById('lr').dataset.points "
                                                            "|| '0'")) > 10 * len(rows), 30, "the per-step rate")
    assert lr_points and all(row["lr_curve"] for row in rows)
    screenshot(browser, "job-finished")
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, errors
