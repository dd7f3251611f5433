"""A running worker's Prometheus endpoint shows training and checkpoints moving."""
from __future__ import annotations

import pytest

import re
import time
import urllib.request

from baton.jobs.services import free_port
from tests.workers.queue.test_worker_loss import SPEC, running_at_step, wait_for


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r"^(baton_[a-z_]+(?:\{[^}]*\})?) (\S+)$", text, re.M)}


def _settled(port: int) -> dict[str, float]:
    """The worker's metrics once no job runs: a job's record says it succeeded a moment before its
    worker's gauges say it ended."""
    def idle():
        now = scrape(port)
        return now if now["baton_jobs_running"] == 0 else None
    return wait_for(idle, timeout=10)


@pytest.mark.slow
def test_steps_checkpoint_stalls_and_lease_renewals_move_during_a_job(cluster):
    port = free_port()
    cluster.start_workers(1, BATON_METRICS_PORT=str(port))
    job = cluster.client.submit(SPEC, "observed")
    wait_for(running_at_step(job, 2))
    before = scrape(port)
    assert before["baton_jobs_running"] == 1 and before["baton_jobs_started_total"] == 1
    time.sleep(4)
    during = scrape(port)
    assert during["baton_steps_total"] > before["baton_steps_total"] > 0
    assert during["baton_checkpoint_stall_seconds_count"] > before["baton_checkpoint_stall_seconds_count"]
    assert during["baton_checkpoint_stall_seconds_sum"] > 0 and during["baton_checkpoint_bytes_total"] > 0
    assert during["baton_lease_renewals_total"] > before["baton_lease_renewals_total"]
    assert during["baton_steps_per_second"] > 0
    job.wait(timeout=120, progress=False)
    after = _settled(port)
    assert after['baton_jobs_finished_total{outcome="succeeded"}'] == 1


@pytest.mark.slow
def test_a_taken_metrics_port_moves_to_the_next_free_one_and_says_so(cluster):
    port = free_port()
    first, second = cluster.start_workers(2, BATON_METRICS_PORT=str(port))  # both become ready
    logs = first.log() + second.log()
    assert logs.count(f"metrics: cannot listen on port {port}") == 1
    moved = re.search(rf"metrics: serving /metrics on port (\d+) \(BATON_METRICS_PORT {port} was taken\)", logs)
    assert moved and int(moved[1]) > port, logs
    assert scrape(port)["baton_jobs_running"] == 0 and scrape(int(moved[1]))["baton_jobs_running"] == 0
