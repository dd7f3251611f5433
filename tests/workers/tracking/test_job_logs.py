"""Per-job logs on real workers: a chatty job (stdout, stderr, logging, from a DataLoader worker
process) SIGKILLed and resumed on the other worker; `baton logs` shows both attempts' lines in
order, `baton logs -f` follows it live to its end, secrets are redacted. The same job is tracked in
a real MLflow server: one run over both attempts whose metric history equals metrics.jsonl step
for step, params equal to the spec (one end-to-end job checks both: each costs a SIGKILL and a
lease expiry)."""
from __future__ import annotations

import pytest

import json
import os
import re
import subprocess

from baton.storage.job_log import read_log
from baton.workers.tracking.job_logs import Redactor
from baton.workers.tracking.mlflow_tracking import flatten, row_metrics

from tests.helpers import BATON, REPO, committed_manifest, kill_when, make_spec, metrics_rows, uid_of
from tests.workers.queue.test_worker_loss import running_at_step, wait_for

TOKEN = "tok-5ecr3t-value"
REDIS_PASSWORD = "hunter2-pass"
SPEC = make_spec(data={"target": "tests.chatty:chatty_spiral", "kwargs": {"n_per_class": 300, "delay_s": 0.003},
                       "num_workers": 1},
                 loop={"epochs": 3}, checkpoint={"every_steps": 4})
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def _attempt_lines(log: str, attempt: int) -> list[str]:
    lines = log.splitlines()
    start = next(i for i, line in enumerate(lines) if f" baton attempt {attempt} of job " in line)
    end = next((i for i, line in enumerate(lines) if f" baton attempt {attempt + 1} of job " in line), len(lines))
    return lines[start:end]


@pytest.mark.slow
@pytest.mark.parametrize("job_user", ["worker", ""], ids=["as-the-worker", "as-its-own-user"])
def test_logs_of_a_killed_and_resumed_job_in_order_followed_live_secrets_redacted(cluster, mlflow_server, tmp_path, job_user):
    """Also where the job runs as a user of its own (a root worker's default): its log lines reach the store
    through its worker, and its resumed attempt continues its MLflow run."""
    import mlflow

    experiment = f"logs-{tmp_path.name}"
    cluster.start_workers(2, MY_API_TOKEN=TOKEN, MY_REDIS_PASSWORD=REDIS_PASSWORD, MLFLOW_TRACKING_URI=mlflow_server.url,
                          MLFLOW_EXPERIMENT_NAME=experiment, MLFLOW_DISABLE_TELEMETRY="true", BATON_JOB_USER=job_user)
    job = cluster.client.submit(SPEC, "chatty")
    follower = subprocess.Popen([*BATON, "logs", "chatty", "-f"], env=cluster.env, cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    running = wait_for(running_at_step(job, 1))
    assert (uid_of(running.pid) == os.getuid()) == (job_user == "worker")
    holder = cluster.worker(running.worker)
    store = cluster.store()
    client = mlflow.MlflowClient(mlflow_server.url)

    def a_row_in_mlflow() -> bool:  # sent by attempt 1: the resumed attempt must continue its run
        if not store.exists("jobs/chatty/mlflow.json"):
            return False
        run_id = json.loads(store.get_bytes("jobs/chatty/mlflow.json"))["run_id"]
        return bool(client.get_metric_history(run_id, "train_loss"))

    def mid_epoch_1_with_its_first_validation_logged(manifest: dict) -> bool:
        latest = manifest["checkpoints"][-1] if manifest["checkpoints"] else None
        return (latest is not None and latest["kind"] == "step" and latest["epoch"] == 1 and latest["batch_in_epoch"] > 0
                and "epoch 1: step" in read_log(store, "chatty", 1) and a_row_in_mlflow())

    kill_when(holder.proc, store, "chatty", mid_epoch_1_with_its_first_validation_logged)  # SIGKILL, whole group
    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded" and final.attempt == 2, final.error
    followed, errors = follower.communicate(timeout=60)
    assert follower.returncode == 0, errors

    log = job.logs()
    print(log)  # shown if an assertion below fails
    assert followed == log, "-f showed, live, exactly the stored log"
    assert all(re.match(rf"{STAMP} (baton|stdout|stderr) ", line) for line in log.splitlines())
    first, second = _attempt_lines(log, 1), _attempt_lines(log, 2)
    assert log.splitlines() == first + second, "attempt 1's lines, then attempt 2's"
    assert f"started on {holder.name}" in first[0] and f"started on {final.worker}" in second[0]
    assert second[-1].endswith("baton attempt 2 ended: succeeded")
    assert job.logs(attempt=1).splitlines() == first
    for lines in (first, second):  # the loop's log, and the user code's stdout, stderr and logging (from a loader process)
        text = "\n".join(lines)
        assert re.search(r" stderr .*job chatty: epoch \d: step \d+ train_loss", text)
        assert re.search(r" stdout chatty: stdout sample \d+ in pid \d+", text)
        assert " stderr chatty: stderr sample " in text
        assert re.search(r" stderr .*WARNING chatty\.user: chatty: logging sample \d+", text)
    assert "epoch 3: step" in "\n".join(second) and "epoch 1: step" in "\n".join(first)  # epochs count from 1

    # secrets from the worker's environment never reach the stored log, nor the worker's own
    assert "chatty: my token is *** and my redis is redis://:***@db.internal:6379/0" in log
    for text in (log, holder.log(), cluster.worker(final.worker).log()):
        assert TOKEN not in text and REDIS_PASSWORD not in text

    # the same job in MLflow: one run over both attempts, params equal to the spec, each metric's
    # history equal to metrics.jsonl step for step (a step logged twice would show twice)
    [run] = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert run.info.run_id == json.loads(store.get_bytes("jobs/chatty/mlflow.json"))["run_id"]
    assert run.info.status == "FINISHED" and run.info.run_name == "chatty"
    assert run.data.params == flatten(json.loads(store.get_bytes("jobs/chatty/spec.json")))
    assert run.data.params["optimizer.lr"] == "0.01" and run.data.params["loop.epochs"] == "3"
    rows = metrics_rows(store, "chatty")
    assert len(rows) == 3
    keys = set().union(*(row_metrics(row) for row in rows))
    assert {"train_loss", "val_loss", "val_accuracy", "lr", "grad_norm", "epoch"} <= keys
    assert set(run.data.metrics) == keys  # nothing else (no bookkeeping field logged as a metric)
    for key in keys:
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert history == [(row["step"], float(row[key])) for row in rows if key in row], key
    tags, manifest = run.data.tags, committed_manifest(store, "chatty")
    assert tags["baton.job_id"] == "chatty" and tags["baton.attempts"] == "2"
    assert tags["baton.worker.attempt-1"] == holder.name
    assert tags["baton.worker.attempt-2"] == final.worker == tags["baton.worker"]
    assert tags["baton.best_checkpoint"] == f"{store.url}/{manifest.best.key}"
    assert tags["baton.best_metric"] == "val_loss" and float(tags["baton.best_value"]) == manifest.best.value
    assert tags["baton.final_model"] == f"{store.url}/{manifest.final.model.key}"


def test_redactor_hides_secret_variables_and_url_passwords():
    redact = Redactor({"AWS_SECRET_ACCESS_KEY": "abcd1234secret", "AWS_SESSION_TOKEN": "sess-tok-9",
                       "BATON_REDIS_URL": "rediss://user:pw-in-url@redis:6380/0", "HOME": "/home/baton", "X_TOKEN": "1"})
    line = "key abcd1234secret tok sess-tok-9 pw pw-in-url url redis://:other-pass@h:1/0 home /home/baton 1"
    assert redact(line) == "key *** tok *** pw *** url redis://:***@h:1/0 home /home/baton 1"


def test_the_console_copy_is_redacted_when_a_secret_is_split_between_two_reads(tmp_path):
    """The tee passes what user code writes to the worker's console as well: a secret arriving in
    two reads of the pipe must be hidden there as in the stored log."""
    import os

    from baton.storage.stores.file_store import FileStore
    from baton.storage.layout import JobPaths
    from baton.workers.tracking.job_logs import JobLogCapture

    capture = JobLogCapture(FileStore(tmp_path / "store"), JobPaths("split", 1), {"MY_API_TOKEN": "abcd1234secret"})
    read_end, write_end = os.pipe()
    capture._saved = {1: write_end, 2: write_end}
    for part in (b"token abcd12", b"34secret here\nprogress 50%\r", b"tail abcd1234", b"secret\n"):
        capture._take(1, part)
    os.close(write_end)
    console = os.read(read_end, 4096).decode()
    os.close(read_end)
    assert console == "token *** here\nprogress 50%\rtail ***\n"


def test_chunks_roll_over_and_follow_reads_them_in_order(tmp_path, monkeypatch):
    """A chunk is rewritten while it grows, left as is when full; readers see every line once, in
    order, across chunks and attempts."""
    from baton.storage.job_log import follow_log, log_chunks
    from baton.storage.stores.file_store import FileStore
    from baton.storage.layout import JobPaths
    from baton.workers.tracking import job_logs

    monkeypatch.setattr(job_logs, "CHUNK_BYTES", 100)  # two of these lines per chunk
    store = FileStore(tmp_path / "store")
    written = []
    for attempt in (1, 2):
        chunks = job_logs._Chunks(store, JobPaths("rolled", attempt))
        for i in range(6):
            line = f"attempt {attempt} line {i} " + "x" * 20
            chunks.add(line)
            written.append(line)
            if i % 2:
                chunks.flush()
    assert [(a, n) for a, n, _ in log_chunks(store, "rolled")] == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    assert read_log(store, "rolled").splitlines() == written
    assert read_log(store, "rolled", attempt=2).splitlines() == written[6:]
    shown: list[str] = []
    follow_log(store, "rolled", shown.append, done=lambda: True)
    assert "".join(shown).splitlines() == written


def test_follow_keeps_the_lines_a_chunk_gained_as_it_was_sealed(tmp_path, monkeypatch):
    """A follower that read a chunk while it grew must read it once more after the next chunk
    appears: the lines added before it was sealed are not lost."""
    from baton.storage.job_log import follow_log
    from baton.storage.stores.file_store import FileStore
    from baton.storage.layout import JobPaths
    from baton.workers.tracking import job_logs

    monkeypatch.setattr(job_logs, "CHUNK_BYTES", 100)  # two of these lines per chunk
    store = FileStore(tmp_path / "store")
    chunks = job_logs._Chunks(store, JobPaths("sealed", 1))
    lines = [f"line {i} " + "x" * 30 for i in range(5)]

    def write(*numbers: int):
        for i in numbers:
            chunks.add(lines[i])
        chunks.flush()

    script = [lambda: write(0), lambda: write(1, 2), lambda: write(3, 4)]  # line 2 seals chunk 0 (lines 0, 1)

    def done() -> bool:  # asked before each read: the job writes between the follower's reads
        if script:
            script.pop(0)()
            return False
        return True

    shown: list[str] = []
    follow_log(store, "sealed", shown.append, done=done, poll_s=0)
    assert "".join(shown).splitlines() == lines
