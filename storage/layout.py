"""Every object path baton writes, built in one place (DESIGN "Storage layout")."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_JOB_ID_RE = re.compile(JOB_ID_PATTERN)


def check_job_id(job_id: str) -> str:
    if not _JOB_ID_RE.fullmatch(job_id):  # not .match: its "$" also matches before a trailing newline
        raise ValueError(f"job id must match {JOB_ID_PATTERN} (got {job_id!r})")
    return job_id


def new_job_id(name: str) -> str:
    """``<name>-<UTC time>-<4 hex>``: readable, sortable, unlikely to collide."""
    import secrets
    from datetime import datetime, timezone

    return check_job_id(f"{name}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}")


JOBS_PREFIX = "jobs/"
"""Every job's objects live under ``jobs/<id>/``."""
_SPEC_KEY_RE = re.compile(r"^jobs/([^/]+)/spec\.json$")

CODE_PREFIX = "code/"
"""Shipped code archives, one per digest, shared by every job of the store that ships the same files."""

PROBE_PREFIX = "baton-probe/"
"""Where a worker's start-up probe of conditional writes puts its (deleted) objects."""

_ATTEMPT_KEY_RE = re.compile(r"^jobs/[^/]+/attempt-(\d+)/")
_SIDE_OUTPUT_RE = re.compile(r"^jobs/[^/]+/attempt-\d+/(tensorboard|logs)/")
_LOG_CHUNK_RE = re.compile(r"^jobs/[^/]+/attempt-(\d+)/logs/(\d+)\.log$")


def code_key(digest: str) -> str:
    """Where the archive of ``digest`` (``sha256:<hex>``) is stored."""
    return f"{CODE_PREFIX}{digest.replace(':', '-')}.tar.gz"


def probe_key(token: str) -> str:
    return f"{PROBE_PREFIX}{token}"


def job_id_of_spec(key: str) -> Optional[str]:
    """The job id of a ``jobs/<id>/spec.json`` key (how a listing finds every job a store holds), else None."""
    match = _SPEC_KEY_RE.fullmatch(key)
    return match[1] if match and _JOB_ID_RE.fullmatch(match[1]) else None


def attempt_of(key: str) -> Optional[int]:
    """The attempt that wrote an attempt-keyed object, or None for a shared key."""
    match = _ATTEMPT_KEY_RE.match(key)
    return int(match[1]) if match else None


def is_side_output(key: str) -> bool:
    """An attempt's output for people and their tools (TensorBoard event files, the job's own log),
    found by listing its directory as those tools do, never through the manifest: garbage
    collection keeps it."""
    return bool(_SIDE_OUTPUT_RE.match(key))


def log_chunk_of(key: str) -> Optional[tuple[int, int]]:
    """``(attempt, chunk number)`` of a job-log chunk's key (``JobPaths.log_chunk``), else None."""
    match = _LOG_CHUNK_RE.fullmatch(key)
    return (int(match[1]), int(match[2])) if match else None


@dataclass(frozen=True)
class JobPaths:
    """A job's keys. Only ``spec.json`` (written once, at submit) and ``manifest.json`` (replaced
    with a compare-and-swap) are shared; everything an attempt writes lives under its own
    ``attempt-<n>/`` prefix, so no attempt ever overwrites another's bytes. Readers reach those
    objects through the manifest only. ``attempt`` is needed for the attempt-keyed paths."""

    job_id: str
    attempt: Optional[int] = None

    def __post_init__(self) -> None:
        check_job_id(self.job_id)

    def for_attempt(self, attempt: int) -> "JobPaths":
        return JobPaths(self.job_id, attempt)

    @property
    def root(self) -> str:
        return f"{JOBS_PREFIX}{self.job_id}"

    @property
    def spec(self) -> str:
        return f"{self.root}/spec.json"

    @property
    def manifest(self) -> str:
        return f"{self.root}/manifest.json"

    @property
    def queued(self) -> str:
        """Written at submit: the job belongs to a queue, whose workers run it (``baton run`` refuses it)."""
        return f"{self.root}/queued.json"

    @property
    def run_lease(self) -> str:
        """``baton run``'s hold on the job while a process trains it in place (no Redis)."""
        return f"{self.root}/run-lease.json"

    @property
    def mlflow_run(self) -> str:
        """The job's MLflow run (tracking URI without credentials, experiment and run id), created
        once by the first attempt that reaches MLflow (a conditional create) and read by every later
        one, so that all attempts log into one run."""
        return f"{self.root}/mlflow.json"

    @property
    def attempts(self) -> str:
        """The prefix of every attempt-keyed object of the job (garbage collection lists it)."""
        return f"{self.root}/attempt-"

    @property
    def attempt_root(self) -> str:
        if self.attempt is None:
            raise ValueError(f"job {self.job_id}: attempt-keyed paths need the attempt (JobPaths.for_attempt)")
        return f"{self.attempts}{self.attempt}"

    def checkpoint(self, step: int) -> str:
        return f"{self.attempt_root}/checkpoints/step-{step}.pt"

    def checkpoint_dir(self, step: int) -> str:
        """A sharded checkpoint's prefix: its files are ``<prefix>/<name>`` (``CheckpointEntry.files``)."""
        return f"{self.attempt_root}/checkpoints/step-{step}"

    def metrics(self, step: int) -> str:
        """The metrics rows as of the checkpoint at ``step`` (referenced from the manifest)."""
        return f"{self.attempt_root}/metrics/step-{step}.jsonl"

    @property
    def final_model(self) -> str:
        return f"{self.attempt_root}/final/model.safetensors"

    @property
    def best_model(self) -> str:
        return f"{self.attempt_root}/final/best.safetensors"

    @property
    def report(self) -> str:
        return f"{self.attempt_root}/final/report.json"

    @property
    def curves(self) -> str:
        return f"{self.attempt_root}/final/curves.png"

    @property
    def tensorboard(self) -> str:
        """The attempt's TensorBoard log directory (``tensorboard --logdir`` on the job's prefix
        shows one run per attempt, each continuing the steps of the one before)."""
        return f"{self.attempt_root}/tensorboard"

    def tensorboard_file(self, name: str) -> str:
        if not name or "/" in name:
            raise ValueError(f"an event file's name must be a plain file name (got {name!r})")
        return f"{self.tensorboard}/{name}"

    @property
    def logs(self) -> str:
        """The attempt's own log (every line the job printed or logged), in numbered chunks."""
        return f"{self.attempt_root}/logs/"

    def log_chunk(self, number: int) -> str:
        """One chunk of the attempt's log: rewritten by its attempt while it grows, then left as is
        once full (the next chunk begins). Readers list ``logs`` and read the chunks in order."""
        return f"{self.logs}{number:06d}.log"
