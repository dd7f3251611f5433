"""Prometheus metrics a worker exposes on ``BATON_METRICS_PORT`` (``/metrics``; 0 turns it off).

Every metric is declared here, once. Code elsewhere reports through callbacks; only the worker
side touches these objects.
"""
from __future__ import annotations

import logging
from typing import Optional

from prometheus_client import Counter, Gauge, Histogram, start_http_server

_log = logging.getLogger("baton.worker")

JOBS_STARTED = Counter("baton_jobs_started_total", "Attempts this worker started.")
JOBS_FINISHED = Counter("baton_jobs_finished_total", "Attempts that ended here, by outcome.", ["outcome"])
JOBS_RETRIED = Counter("baton_jobs_retried_total", "Jobs re-queued, by reason (preempted: released here; "
                       "lost: reaped by this worker's reaper; storage: storage unreachable; stalled: hung, no step in BATON_STALL_TIMEOUT_S; "
                       "redis: its lease lapsed while Redis was unreachable, re-queued uncounted; rank_lost: a data-parallel rank died; "
                       "checkpoint_write: this machine could not write a checkpoint, a full disk or /dev/shm; crashed: the job's "
                       "training process died, and this worker took the job back itself).", ["reason"])
JOBS_RUNNING = Gauge("baton_jobs_running", "Jobs training in this worker now.")
STEPS = Counter("baton_steps_total", "Optimizer steps trained.")
STEPS_PER_S = Gauge("baton_steps_per_second", "Optimizer steps per second of the running job (last report).")
SAMPLES_PER_S = Gauge("baton_samples_per_second", "Training samples per second of the running job (last report).")
CHECKPOINT_STALL = Histogram("baton_checkpoint_stall_seconds", "Time the training loop was blocked per checkpoint.",
                             buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
CHECKPOINT_WRITE = Histogram("baton_checkpoint_upload_seconds", "Background serialize + upload + commit per checkpoint.",
                             buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
CHECKPOINT_BYTES = Counter("baton_checkpoint_bytes_total", "Bytes of committed checkpoints.")
LEASE_RENEWALS = Counter("baton_lease_renewals_total", "Lease renewals by this worker's heartbeats.")
TRACKING_FAILURES = Counter("baton_tracking_failures_total", "Failed writes or uploads of experiment tracking "
                            "(TensorBoard event files, MLflow; job log uploads), by tracker; the job goes on without them.", ["tracker"])
QUEUE_JOBS = Gauge("baton_queue_jobs", "Jobs of a queue, waiting or running (slots held: a job on N nodes holds N). "
                   "Set by the worker that made the last scheduler turn and cleared on the others: read it with max() "
                   "over the workers (deploy/kubernetes/keda-scaledobject.yaml).", ["queue", "state"])
YIELDS = Counter("baton_yields_total", "Running jobs the scheduler asked to yield, by why (priority, reclaim).", ["why"])
FENCING_EVENTS = Counter("baton_fencing_events_total", "Attempts in this worker fenced out by a newer attempt.")


PORT_SEARCH = 32
"""Ports tried above a taken BATON_METRICS_PORT (two workers on one host with the same setting)."""


def serve(port: int) -> Optional[int]:
    """Start the /metrics endpoint in a daemon thread (nothing when ``port`` is 0) and return its port.

    A taken port does not cost the metrics: the next free one above it is used and logged, so two
    workers started on one host with the same setting both serve (scrape configs can list the range).
    """
    if not port:
        return None
    for candidate in range(port, port + PORT_SEARCH):
        try:
            start_http_server(candidate)
        except OSError as exc:
            if candidate == port:
                _log.warning("metrics: cannot listen on port %d (%s); trying the ports above it", port, exc)
            continue
        if candidate == port:
            _log.info("metrics: serving /metrics on port %d", candidate)
        else:
            _log.warning("metrics: serving /metrics on port %d (BATON_METRICS_PORT %d was taken)", candidate, port)
        return candidate
    _log.error("metrics: ports %d-%d are all taken; this worker serves no /metrics", port, port + PORT_SEARCH - 1)
    return None
