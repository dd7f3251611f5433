"""MLflow tracking: each job is one MLflow run, continued by every attempt, each step logged once.

On when ``MLFLOW_TRACKING_URI`` is set where the job runs (MLflow's own variable; the experiment is
``MLFLOW_EXPERIMENT_NAME``, else ``baton``: not the spec's name, which a sweep makes ``NAME-N`` per
job and so would scatter one sweep over many experiments). The run holds:
- params: the spec, flattened to dotted paths (``optimizer.lr``), logged when the run is created;
- metrics: every numeric field of each metrics row (``train_loss``, every ``val_NAME``, ``lr``,
  ``grad_norm``, ...) at the row's ``step``, once the checkpoint at that step is committed;
- tags: ``baton.job_id``, ``baton.spec_name``, ``baton.attempts`` and ``baton.worker`` (the latest attempt and where it ran,
  ``baton.worker.attempt-N`` for each), ``baton.storage`` (the job's prefix in object storage), and
  ``baton.best_checkpoint`` with the metric, value and step that made it best, then at the end
  ``baton.final_model`` / ``baton.best_model``: object-storage URIs beside the metrics that chose them.

One run per job: its id is kept with the job in object storage (``jobs/<id>/mlflow.json``, created
once with a conditional write), not in the Redis record, because ``baton run`` has no Redis and a
job whose records Redis lost (``baton recover``) must still continue its run. A resumed attempt
reads it, asks MLflow for the last step it holds, and logs the committed rows after that step
(rows its predecessor committed but could not send) and then its own: no step is logged twice.
A retried batch reuses its timestamps, so a batch the server half-wrote is not doubled either.

Tracking never fails or slows a job: the loop only puts items on a bounded queue; one daemon thread
talks to MLflow. A failure is logged (once, with the steps still to send), counted
(``baton_tracking_failures_total{tracker="mlflow"}``) and retried with backoff; what is still unsent
when the attempt ends is logged as the gap. MLflow's own HTTP retries are turned off (``setdefault``:
a user's setting wins) because their jitter draws from Python's global ``random``, which belongs
to the training run (a resumed job's RNG state would silently change).
"""
from __future__ import annotations

import json
import logging
import os
import queue
import re
import threading
import time
from typing import Any, Callable, Optional

from baton.schemas.errors import PreconditionFailed
from baton.storage.artifacts import read_metrics
from baton.storage.stores.base import ObjectStore
from baton.storage.layout import JobPaths
from baton.storage.manifest_store import ManifestStore

from baton.workers.tracking import prometheus

_log = logging.getLogger("baton.tracking")

TRACKER = "mlflow"
URI_VARIABLE = "MLFLOW_TRACKING_URI"
EXPERIMENT_VARIABLE = "MLFLOW_EXPERIMENT_NAME"
DEFAULT_EXPERIMENT = "baton"
QUEUE_MAX = 10_000
"""Items (rows, commits) waiting for the thread; past it new rows are dropped and counted, never waited for."""
RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Backoff between tries while MLflow fails (the last value repeats)."""
CLOSE_WAIT_S = 10.0
"""Longest an attempt waits at its end for MLflow to take what is left (then it is logged as a gap)."""
LINGER_S = 120.0
"""How long the thread goes on retrying after its attempt ended (a worker process outlives its jobs)."""
METRICS_PER_BATCH = 1000  # log_batch's limits (MLflow REST API)
PARAMS_PER_BATCH = 100
PARAM_VALUE_MAX = 6000
SKIPPED_FIELDS = ("step", "time", "is_best", "checkpoint")
"""Row fields that are not metrics: the step is MLflow's step, the time its timestamp; the best
checkpoint is a tag. Fields starting with ``_`` are bookkeeping, never metrics."""
CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
                   "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
"""Retries are this module's own (no jitter from the global ``random``); a request never hangs long."""
_CREDENTIALS = re.compile(r"(?<=://)[^/\s]*@(?=[^@/\s]*(?:[/\s?#]|$))")  # user info ends at the last '@' 


def tracking_uri(environ=os.environ) -> Optional[str]:
    return environ.get(URI_VARIABLE) or None


def shown_uri(uri: str) -> str:
    """The tracking URI (or a message quoting it) without ``user:password@``: it is stored with the
    job and logged."""
    return _CREDENTIALS.sub("", uri)


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """A spec as MLflow params: dotted paths to strings (lists as JSON; values cut to MLflow's limit)."""
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}{key}."))
        return out
    text = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return {prefix[:-1]: text[:PARAM_VALUE_MAX]}


def row_metrics(row: dict) -> dict[str, float]:
    """The metrics a row becomes at its step: every numeric field but the step."""
    return {k: float(v) for k, v in row.items()
            if k not in SKIPPED_FIELDS and not k.startswith("_") and isinstance(v, (int, float))
            and not isinstance(v, bool)}


def row_timestamp_ms(row: dict) -> Optional[int]:
    """The row's own time as MLflow's timestamp: whichever attempt sends a row (the one that made
    it, or a later one reading it from metrics.jsonl), it sends the same metric, which an
    SQL-backed tracking server keeps once (MLflow's file store, ``./mlruns``, would append it). None for rows written before rows carried their time."""
    return int(row["time"] * 1000) if row.get("time") else None


class Unusable(Exception):
    """This attempt cannot track the job in MLflow at all (no retry helps)."""


class MlflowTracker:
    """One attempt's link to the job's MLflow run. ``row``, ``committed``, ``resumed_from``,
    ``finish`` never block and never raise."""

    def __init__(self, uri: str, store: ObjectStore, paths: JobPaths, spec: dict, monitor: str,
                 worker: str, log: Callable[[str], None]):
        for name, value in CLIENT_DEFAULTS.items():
            os.environ.setdefault(name, value)
        self.uri, self.store, self.paths, self.spec = uri, store, paths, spec
        self.monitor, self.worker = monitor, worker
        self.log = lambda message: log(shown_uri(message))  # MLflow's errors quote the URI, credentials included
        self.run_id: Optional[str] = None
        self._queue: "queue.Queue[tuple[str, Any]]" = queue.Queue(QUEUE_MAX)
        self._pending: list[dict] = []  # rows not yet covered by a commit
        self._ready: list[dict] = []  # committed rows not yet in MLflow, by step
        self._logged_through = -1  # the last step MLflow holds
        self._final: Optional[str] = None  # the run status to send at the attempt's end
        self._failing_since: Optional[float] = None
        self._dropped = 0
        self._disabled = False
        self._settled = threading.Event()  # after close: everything sent, or the last try failed
        self._thread = threading.Thread(target=self._run, name=f"baton-mlflow-{paths.job_id}", daemon=True)
        self._thread.start()

    # --- called from the loop, the checkpointer and the session -----------------------------------
    def resumed_from(self, step: int) -> None:
        self._put("resume", step)

    def row(self, row: dict) -> None:
        self._put("row", dict(row))

    def committed(self, step: int) -> None:
        self._put("commit", step)

    def finish(self, status: str) -> None:
        """How the attempt ended for the run: FINISHED (the final artifacts' URIs are tagged), FAILED,
        KILLED, or RUNNING (the job goes on in another attempt)."""
        self._put("finish", status)

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Wait (at most ``wait_s``) for one more try to send what is left; what is still unsent is
        logged as the gap, and the thread goes on retrying for ``LINGER_S`` in the background."""
        self._put("close", None)
        self._settled.wait(wait_s)
        if not self._disabled and not self._synced():
            self._gap("not logged yet at the attempt's end (retried in the background for "
                      f"{LINGER_S:.0f}s more while this process lives)")

    def _put(self, kind: str, value: Any) -> None:
        if self._disabled:
            return
        try:
            self._queue.put_nowait((kind, value))
        except queue.Full:  # MLflow has been away for long: drop, count, say so at the end
            self._dropped += 1
            prometheus.TRACKING_FAILURES.labels(TRACKER).inc()

    # --- the background thread --------------------------------------------------------------------
    def _run(self) -> None:
        tries, next_try, give_up_at = 0, 0.0, None
        while True:
            now = time.monotonic()
            if give_up_at is not None and (self._synced() or self._disabled or now >= give_up_at):
                self._settled.set()
                return
            timeout = None if self._synced() or self._disabled else max(0.0, next_try - now)
            try:
                kind, value = self._queue.get(timeout=timeout)
                if self._take(kind, value):
                    give_up_at, next_try = time.monotonic() + LINGER_S, 0.0  # one more try at once
                continue  # take everything queued before talking to MLflow
            except queue.Empty:
                pass
            if self._synced() or self._disabled or time.monotonic() < next_try:
                continue
            try:
                self._sync()
            except (ImportError, Unusable) as exc:
                self._disabled = True
                self.log(f"MLflow: not tracking this job: {exc}")
                continue
            except Exception as exc:  # tracking must never fail the job: logged, counted, retried
                tries += 1
                next_try = time.monotonic() + RETRY_S[min(tries, len(RETRY_S)) - 1]
                prometheus.TRACKING_FAILURES.labels(TRACKER).inc()
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                    self.log(f"MLflow: {type(exc).__name__}: {_short(exc)}; steps {self._unsent_steps()} held back and "
                             f"retried in the background; training goes on")
                _log.debug("job %s: MLflow try %d failed", self.paths.job_id, tries, exc_info=True)
                if give_up_at is not None:
                    self._settled.set()  # the attempt has ended: it waits no longer
                continue
            if self._failing_since is not None:
                self.log(f"MLflow: reachable again after {time.monotonic() - self._failing_since:.0f}s; "
                         f"the rows held back are logged")
            tries, self._failing_since = 0, None

    def _take(self, kind: str, value: Any) -> bool:
        """Apply one queued item to the thread's state; True for ``close``."""
        if kind == "row":
            self._pending.append(value)
        elif kind == "commit":
            self._ready += [row for row in self._pending if row["step"] <= value]
            self._pending = [row for row in self._pending if row["step"] > value]
        elif kind == "finish":
            self._final = value
        elif kind == "close":
            return True
        return False  # "resume": the steps MLflow holds decide what is sent (see _open)

    def _synced(self) -> bool:
        return self.run_id is not None and not self._ready and self._final is None

    def _sync(self) -> None:
        client = self._client()
        if self.run_id is None:
            self._open(client)
        self._send_rows(client)
        if self._final is not None:
            if self._final == "FINISHED":
                self._set_tags(client, self._final_tags())
            if self._final != "RUNNING":
                client.set_terminated(self.run_id, self._final)
            self._final = None

    def _final_tags(self) -> dict[str, str]:
        """The finished job's artifacts, as its manifest lists them."""
        manifest = ManifestStore(self.store, self.paths).read()
        refs = {"baton.final_model": manifest.final.model if manifest.final else None,
                "baton.best_model": manifest.final.best_model if manifest.final else None,
                "baton.best_checkpoint": manifest.best}
        return {tag: f"{self.store.url}/{ref.key}" for tag, ref in refs.items() if ref is not None}

    def _client(self):
        if not hasattr(self, "_mlflow_client"):
            try:
                from mlflow import MlflowClient  # optional: baton[mlflow] (mlflow-skinny is enough on workers)
            except ImportError:
                raise ImportError(f"{URI_VARIABLE} is set but mlflow is not installed "
                                  "(pip install 'baton[mlflow]')") from None

            self._mlflow_client = MlflowClient(tracking_uri=self.uri)
        return self._mlflow_client

    def _open(self, client) -> None:
        """Find the job's run (or create it), mark this attempt, and queue the committed rows MLflow lacks."""
        run_id = self._stored_run_id()
        if run_id is None:
            run_id = self._create_run(client)
        self._log_missing_params(client, run_id)
        attempt = str(self.paths.attempt)
        self._set_tags(client, {"baton.attempts": attempt, "baton.worker": self.worker,
                                f"baton.worker.attempt-{attempt}": self.worker}, run_id)
        client.update_run(run_id, status="RUNNING")
        history = client.get_metric_history(run_id, "train_loss")
        self._logged_through = max((m.step for m in history), default=-1)
        committed = read_metrics(self.store, ManifestStore(self.store, self.paths).read())
        known = {row["step"] for row in self._ready}
        self._ready = sorted(self._ready + [row for row in committed if row["step"] not in known],
                             key=lambda row: row["step"])
        self.run_id = run_id

    def _stored_run_id(self) -> Optional[str]:
        try:
            stored = json.loads(self.store.get_bytes(self.paths.mlflow_run))
        except FileNotFoundError:
            return None
        if stored["tracking_uri"] != shown_uri(self.uri):
            raise Unusable(f"job {self.paths.job_id} logs to the MLflow at {stored['tracking_uri']}, not "
                               f"{shown_uri(self.uri)} (set MLFLOW_TRACKING_URI alike on every worker)")
        return stored["run_id"]

    def _create_run(self, client) -> str:
        name = os.environ.get(EXPERIMENT_VARIABLE) or DEFAULT_EXPERIMENT
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else _create_experiment(client, name)
        run = client.create_run(experiment_id, run_name=self.paths.job_id,
                                tags={"baton.job_id": self.paths.job_id, "baton.spec_name": self.spec["name"],
                                      "baton.storage": f"{self.store.url}/{self.paths.root}"})
        run_id = run.info.run_id
        record = {"tracking_uri": shown_uri(self.uri), "experiment_id": experiment_id, "run_id": run_id}
        try:
            self.store.put_if(self.paths.mlflow_run, json.dumps(record).encode(), None)
        except PreconditionFailed:  # another attempt created the job's run first: use that one
            client.delete_run(run_id)
            stored = self._stored_run_id()
            assert stored is not None  # (what refused this one's record)
            return stored
        return run_id

    def _log_missing_params(self, client, run_id: str) -> None:
        """The spec's params the run does not hold yet: all of them for a new run, and whatever a
        failed try (or a killed attempt) left out after the run id was stored."""
        from mlflow.entities import Param

        held = client.get_run(run_id).data.params
        params = [Param(k, v) for k, v in flatten(self.spec).items() if k not in held]
        for i in range(0, len(params), PARAMS_PER_BATCH):
            client.log_batch(run_id, params=params[i:i + PARAMS_PER_BATCH])

    def _send_rows(self, client) -> None:
        from mlflow.entities import Metric

        while self._ready:
            rows = [row for row in self._ready if row["step"] > self._logged_through]
            if not rows:
                self._ready = []
                return
            row = rows[0]
            stamp = row_timestamp_ms(row) or row.setdefault("_timestamp_ms", int(time.time() * 1000))
            # a retry (and another attempt sending the same committed row) sends the same metrics: the server keeps one
            batch = [Metric(k, v, stamp, row["step"]) for k, v in row_metrics(row).items()]
            for i in range(0, len(batch), METRICS_PER_BATCH):
                client.log_batch(self.run_id, metrics=batch[i:i + METRICS_PER_BATCH])
            if row.get("is_best") and row.get("checkpoint"):
                self._set_tags(client, {"baton.best_checkpoint": f"{self.store.url}/{row['checkpoint']}",
                                        "baton.best_metric": self.monitor,
                                        "baton.best_value": repr(row.get(self.monitor)),
                                        "baton.best_step": str(row["step"])})
            self._logged_through = row["step"]
            self._ready = [r for r in self._ready if r["step"] > self._logged_through]

    def _set_tags(self, client, tags: dict[str, str], run_id: Optional[str] = None) -> None:
        from mlflow.entities import RunTag

        client.log_batch(run_id or self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    # --- what is missing ---------------------------------------------------------------------------
    def _unsent_steps(self) -> str:
        steps = [row["step"] for row in list(self._ready) if row["step"] > self._logged_through]
        return f"{steps[0]}..{steps[-1]}" if len(steps) > 1 else (str(steps[0]) if steps else "(none yet)")

    def _gap(self, why: str) -> None:
        prometheus.TRACKING_FAILURES.labels(TRACKER).inc()
        dropped = f"; {self._dropped} items dropped while MLflow was away" if self._dropped else ""
        self.log(f"MLflow: gap in run {self.run_id or '(not created)'}: steps {self._unsent_steps()} {why}{dropped}; "
                 f"metrics.jsonl has every row (the next attempt of this job sends what it finds missing)")


def _create_experiment(client, name: str) -> str:
    from mlflow.exceptions import MlflowException

    try:
        return client.create_experiment(name)
    except MlflowException:  # created meanwhile by another job
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def _short(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "..."
