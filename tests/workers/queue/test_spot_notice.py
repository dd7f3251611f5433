"""A machine's preemption notice (a local server standing in for the metadata service): the worker reads
it before any SIGTERM, its job yields at the next step (0 steps redone, bit-exact on the other worker),
and the worker exits as after a SIGTERM."""
from __future__ import annotations

import json

import pytest

from baton.workers.queue.spot_notice import notice, NoticePoller
from tests.notice_server import NoticeServer
from tests.workers.queue.test_preemption import _check_yielded, _dirs, counted, reference  # noqa: F401 (a fixture)
from tests.workers.queue.test_worker_loss import running_at_step, wait_for

AWS = "/latest/meta-data/spot/instance-action"
GCP = "/computeMetadata/v1/instance/preempted"


@pytest.fixture
def server():
    serving = NoticeServer()
    yield serving
    serving.close()


def test_what_counts_as_a_notice(server):
    assert notice(server.url(AWS)) == (None, 404)  # AWS before an action is scheduled
    server.notices[AWS] = (200, json.dumps({"action": "terminate", "time": "2026-11-26T10:00:00Z"}))
    assert notice(server.url(AWS))[0].startswith('{"action": "terminate"')
    server.notices[GCP] = (200, "FALSE")  # GCP answers FALSE until the machine is preempted
    assert notice(server.url(GCP)) == (None, 200)
    server.notices[GCP] = (200, "TRUE")
    assert notice(server.url(GCP)) == ("TRUE", 200)
    assert all(headers.get("Metadata-Flavor") == "Google" for _, _, headers in server.requests)
    assert notice("http://127.0.0.1:9/nothing-listens") == (None, 0)


def test_imdsv2_a_token_is_fetched_when_the_notice_needs_one(server):
    server.token_paths.add(AWS)
    server.notices[AWS] = (200, '{"action": "stop"}')
    seen = []
    poller = NoticePoller(server.url(AWS), seen.append, every_s=0.05)
    poller.start()
    poller.join(timeout=10)
    assert seen == ['{"action": "stop"}']
    assert ("PUT", "/latest/api/token") in [(m, p) for m, p, _ in server.requests]


@pytest.mark.slow
def test_a_spot_notice_yields_the_job_before_any_sigterm(cluster, tmp_path, reference, server):
    first, = cluster.start_workers(1, BATON_PREEMPTION_NOTICE_URL=server.url("/w0" + AWS))
    second, = cluster.start_workers(1, BATON_PREEMPTION_NOTICE_URL=server.url("/w1" + AWS))
    directory, = _dirs(tmp_path, "noticed")
    job = cluster.client.submit(counted(directory), "noticed")
    status = wait_for(running_at_step(job, 5), timeout=120)
    holder = cluster.worker(status.worker)
    path = ("/w0" if holder is first else "/w1") + AWS
    server.notices[path] = (200, json.dumps({"action": "terminate", "time": "2026-11-26T10:02:00Z"}))

    assert holder.started.wait(timeout=90) == 0  # it left as after a SIGTERM (none was sent): job released, exit 0
    final = job.wait(timeout=180, progress=False)
    assert final.state.value == "succeeded" and final.worker != holder.name, final
    assert f'released (preempted (spot notice: {{"action": "terminate"' in holder.log()
    _check_yielded(cluster, job, directory, reference, "spot notice")


def test_a_sigterm_while_the_main_thread_registers_a_job_does_not_deadlock(tmp_path):
    """The handler runs on the main thread, which may hold the preemption's lock (``register``) when the
    signal lands: asking for the shutdown must not wait for that lock."""
    import subprocess
    import sys

    script = (
        "import os, signal\n"
        "from baton.workers.queue.preemption import Preemption\n"
        "p = Preemption()\n"
        "p.install(30.0)\n"
        "with p._lock:\n"  # as register() holds it
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    x = sum(range(1000))\n"  # the handler runs here, inside the lock
        "print('requested' if p.requested.is_set() else 'not requested', p.why, flush=True)\n"
        "os._exit(0)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "requested SIGTERM", done.stdout + done.stderr


def test_a_garbled_answer_is_no_notice_and_the_poller_goes_on(server):
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def garble():
        for _ in range(2):
            conn, _ = listener.accept()
            conn.recv(4096)
            conn.sendall(b"NOT-HTTP garbage\r\n\r\n")
            conn.close()
    threading.Thread(target=garble, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}{AWS}"
    assert notice(url) == (None, 0)
    seen = []
    poller = NoticePoller(url, seen.append, every_s=0.05)
    poller.start()
    poller.join(timeout=1)
    assert poller.is_alive() and seen == []  # still polling after a garbled answer
    poller.stop()
    listener.close()
