"""baton's settings, read from ``BATON_*`` environment variables. Each is declared once, typed.

Credentials are not here: boto3 reads the standard AWS_* variables and config files itself,
and a Redis password travels inside ``BATON_REDIS_URL`` (``rediss://`` for TLS).
"""
from __future__ import annotations

from typing import Literal, Mapping

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEPLOYMENT_VARIABLES = frozenset({"BATON_BUCKET", "BATON_WORKER_REPLICAS", "BATON_QUEUES", "BATON_VENV"})
"""BATON_* variables read by the deployment files and scripts, not by baton itself."""
TUNING_VARIABLES = frozenset({"BATON_BACKGROUND_NICE", "BATON_CHECKPOINT_WRITER", "BATON_RENDEZVOUS_TIMEOUT_S",
                              "BATON_COLLECTIVE_TIMEOUT_S"})
"""BATON_* variables read where they act, by the training process (baton.storage.checkpointing.priority,
baton.storage.checkpointing.checkpointer, baton.workers.parallel.launcher, baton.workers.parallel.distributed;
the settings table in docs/workers.md)."""
FAILPOINT_VARIABLES = frozenset({"BATON_FAILPOINT", "BATON_FAILPOINT_PAUSE"})
"""BATON_* variables for tests of what survives a crash or a kill at an exact point (baton.storage.failpoints)."""
DEFAULT_STORAGE_URL = "file://./baton-data"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_JOB_UIDS = "2000000000-2000000999"


def default_redis_notice(environ: Mapping[str, str]) -> str | None:
    """The line a command prints first when it uses the default Redis because BATON_REDIS_URL is
    unset (on a shared machine, 127.0.0.1:6379 may be somebody else's); None when it is set."""
    if environ.get("BATON_REDIS_URL"):
        return None
    return f"baton: BATON_REDIS_URL is not set; using the default Redis at {DEFAULT_REDIS_URL}"


def default_store_notice(environ: Mapping[str, str]) -> str | None:
    """The line a worker prints as it starts when it uses the default store because BATON_STORAGE_URL is
    unset (a directory of this machine: jobs stored elsewhere are not its); None when it is set."""
    if environ.get("BATON_STORAGE_URL"):
        return None
    return (f"baton: BATON_STORAGE_URL is not set; using the default store {DEFAULT_STORAGE_URL} (a directory of "
            "this machine)")


class BatonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BATON_", extra="forbid")

    redis_url: str = Field(DEFAULT_REDIS_URL, description="Broker and job records (redis:// or rediss://).")
    storage_url: str = Field(DEFAULT_STORAGE_URL, description="Checkpoints and artifacts: s3://bucket/prefix or file:///path.")
    allowed_modules: str = Field(
        "", description="Comma-separated module prefixes whose callables a spec may name as targets (builtins always allowed)."
    )
    accept_code: bool = Field(False, description="Whether this worker runs jobs that ship their own code (`code` in the "
                              "spec): anyone who can queue jobs on its Redis then runs code here. Off: it passes such "
                              "jobs on to workers that accept them. BATON_ALLOWED_MODULES applies to shipped code too.")
    server_url: str = Field("", description="The pool's server (`baton server`), e.g. https://pool.example:8470: set, "
                            "every client command and `JobClient()` go through it with your token and need no Redis "
                            "or store credentials of their own. Unset: they use Redis and the store directly.")
    token: SecretStr = Field(SecretStr(""), description="Your token for the pool's server (`baton users add` printed "
                             "it); unset, the first line of ~/.config/baton/token.")
    ui_token: SecretStr = Field(SecretStr(""), description="The token `baton ui` asks of every action (cancel, resume, "
                                "priority, drain), sent as `Authorization: Bearer <token>`; unset, the dashboard is "
                                "read-only. Use a long random value (`python -c 'import secrets; print(secrets.token_urlsafe())'`).")
    code_limit_mb: float = Field(100.0, gt=0, description="The most a job's `code.dir` may hold to ship (its files' "
                                 "megabytes, before compression), checked at submit; a worker refuses an archive "
                                 "larger than its own limit once unpacked.")

    lease_ttl_s: float = Field(3.0, gt=0, description="A running job's lease lives this long unless renewed: a lost "
                               "worker's job is taken over within it (plus a reaper period). Also the longest Redis "
                               "outage a running attempt rides through; past it the attempt stops uncommitted and the "
                               "job is re-queued, not counted (raise it where Redis restarts or fails over slower).")
    heartbeat_s: float = Field(1.0, gt=0, description="How often a worker renews its lease (and reads cancel/stop "
                               "flags). On 2 cores loaded 7x over, renewals came at most 0.19 s late "
                               "(bench/lease_gaps.py).")
    reaper_period_s: float = Field(0.5, gt=0, description="How often each worker looks for expired leases.")
    preempt_grace_s: float = Field(
        60.0, gt=0, description="After SIGTERM a worker checkpoints, releases its job and exits within this; "
        "match it to the platform's notice (Kubernetes terminationGracePeriodSeconds, spot notice)."
    )
    preemption_notice_url: str = Field(
        "", description="An HTTP endpoint the worker polls every second for its machine's preemption notice; a 200 "
        "with a body (not 'FALSE') means the machine will be stopped, and the worker yields its job at once, as on "
        "SIGTERM. AWS: http://169.254.169.254/latest/meta-data/spot/instance-action (IMDSv2 tokens are fetched); GCP: "
        "http://metadata.google.internal/computeMetadata/v1/instance/preempted. Empty: none.")
    stall_timeout_s: float = Field(
        1800.0, ge=0, description="A running job that makes no optimizer step for this long while its lease renews "
        "is hung (stuck data loader or user code): its worker records every thread's stack of its training process, "
        "kills that process and everything below it, and releases the job as a worker loss (counted against "
        "retry.max_attempts). 0 turns it off; keep it above the longest validation, checkpoint wait or first-step "
        "warm-up."
    )
    node_address: str = Field(
        "", description="The address other nodes reach this worker at when it leads a multi-node job (its rendezvous: "
        "a TCP store on a free port); default: the address of the interface its default route leaves by.")
    gang_timeout_s: float = Field(
        300.0, gt=0, description="How long a multi-node job waits for all its nodes to join before its gang is "
        "dissolved and the job offered again (no attempt used).")
    gang_distinct: Literal["host", "worker"] = Field(
        "host", description="What makes workers distinct nodes of a gang: their hosts, or (one machine standing for "
        "several, in tests) their names.")
    job_user: str = Field("", description="The user a job's code runs as: unset, a uid of its own per worker process "
                          "where the worker runs as root (from BATON_JOB_UIDS); FIRST-LAST, a uid from that range; a user's "
                          "name, UID or UID:GID; `worker`, the worker's own user (no isolation).")
    job_uids: str = Field(DEFAULT_JOB_UIDS, description="The uids a root worker gives its jobs (one per worker "
                          "process; no account of the machine may use them).")
    redis_ca_certs: str = Field("", description="CA bundle for rediss:// (default: the system's).")
    metrics_port: int = Field(9100, ge=0, le=65535, description="Worker's Prometheus /metrics port; 0 turns it off. "
                              "`baton worker --gpus`/`--concurrency` gives child i the port + i.")

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, url: str) -> str:
        from urllib.parse import urlsplit

        what = "must be redis://HOST:PORT/DB, rediss://HOST:PORT/DB or unix:///PATH"
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"{what} (got {url!r})")
        try:
            urlsplit(url).port
        except ValueError as exc:
            raise ValueError(f"{what} (got {url!r}: {exc})") from None
        return url

    @field_validator("server_url")
    @classmethod
    def _server_url(cls, url: str) -> str:
        if url and not url.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL (got {url!r})")
        return url.rstrip("/")

    @field_validator("preemption_notice_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if url and not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return url

    @field_validator("storage_url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if not url.startswith(("s3://", "file://")):
            raise ValueError(f"must start with s3:// or file:// (got {url!r})")
        return url

    @model_validator(mode="after")
    def _lease_outlives_heartbeats(self) -> "BatonSettings":
        if self.heartbeat_s * 2 > self.lease_ttl_s:
            raise ValueError(f"BATON_HEARTBEAT_S ({self.heartbeat_s}) must be at most half of BATON_LEASE_TTL_S "
                             f"({self.lease_ttl_s}): one late heartbeat must not lose the lease")
        return self

    @property
    def allowed_prefixes(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.allowed_modules.split(",") if p.strip())


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """BATON_* variables that are no setting (a misspelling is otherwise silently ignored)."""
    known = {f"BATON_{name.upper()}" for name in BatonSettings.model_fields} | DEPLOYMENT_VARIABLES | TUNING_VARIABLES | FAILPOINT_VARIABLES
    return sorted(name for name in environ if name.startswith("BATON_") and name not in known)
