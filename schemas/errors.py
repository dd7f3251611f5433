"""baton's error hierarchy, in one place.

Whether an error is retried is decided by its type, never by matching its text:
- ``UserCodeError``: the job's own model/data code failed. The job fails, it is not retried.
- ``TransientError``: infrastructure that may come back (storage throttling, a dropped connection).
  Retried with backoff where it happens; if it outlives the retries the job is *lost*, not failed.
- ``PermanentError``: a configuration or access problem that retrying cannot fix.
- ``CheckpointWriteFailed``: this machine could not write a checkpoint's local copy (a full disk or
  /dev/shm, an I/O error). The job is released as a loss, for another worker: never failed.
"""
from __future__ import annotations

import traceback as _traceback


class BatonError(Exception):
    """Base class of every error baton raises on purpose."""


class SpecError(BatonError):
    """A job spec (or ``what`` else: a search) is invalid. ``problems`` holds one ``"dotted.path: message"``
    line per wrong field."""

    def __init__(self, problems: list[str], what: str = "job spec"):
        self.problems, self.what = list(problems), what
        super().__init__(f"invalid {what}:\n" + "\n".join(f"  {p}" for p in self.problems))


class ServerError(BatonError):
    """The pool's server refused (401, 403), could not do what was asked, or could not be reached
    (``status`` 0); its one line says why."""

    def __init__(self, status: int, line: str, detail: str = ""):
        self.status, self.detail = status, detail or line
        super().__init__(line)


class OverLimit(SpecError):
    """A job's priority is above its team's max priority (``baton teams set``): a policy's refusal, not a typo."""


class UserCodeError(BatonError):
    """The job's model or data code raised; ``traceback`` is the formatted original. ``origin`` says
    where, when that was another process (``"on rank 1 of 2"``): its traceback then came as text, and
    this process's own frames (which only re-raised it) say nothing about the cause."""

    def __init__(self, message: str, traceback: str = "", origin: str = ""):
        super().__init__(message)
        self.traceback = traceback
        self.origin = origin


def formatted_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as it was raised: for a failure in another process (``UserCodeError.origin``),
    that process's own."""
    if isinstance(exc, UserCodeError) and exc.origin and exc.traceback:
        return f"{exc.traceback.rstrip()}\n(raised {exc.origin})\n"
    return "".join(_traceback.format_exception(exc))


class NonFiniteLossError(UserCodeError):
    """The loss became NaN or infinite under the ``nonfinite: fail`` policy."""


class TransientError(BatonError):
    """Infrastructure trouble that may pass: retried with backoff."""


class PermanentError(BatonError):
    """Infrastructure or configuration trouble that retrying cannot fix."""


class StorageUnavailable(TransientError):
    """The object store could not be reached, throttled us, or answered 5xx."""


class AccessDenied(PermanentError):
    """The object store refused our credentials for this bucket or key."""


class OutsideJob(AccessDenied):
    """A training process asked its store gate for an object outside its own job's ``jobs/<id>/``."""


class StoreUnusable(PermanentError):
    """The store cannot be used at all: its bucket does not exist, its directory cannot be created or
    opened, or no credentials for it were found."""


class PreconditionFailed(BatonError):
    """A conditional write lost its race: the object changed since it was read."""


class CheckpointCorrupt(BatonError):
    """A checkpoint's bytes do not match the size or sha256 recorded when it was committed."""


class FencedOut(BaseException):
    """This worker's attempt is no longer the job's current one; it must stop and commit nothing.

    A ``BaseException`` on purpose (as rq does for its shutdown signal): a stray
    ``except Exception`` in user code must not swallow it.
    """


class ManifestAhead(FencedOut):
    """The manifest belongs to ``current`` (an attempt at least this one's, held by another claim).
    A worker whose claim Redis still confirms catches up past it (Redis was behind the manifest);
    any other writer stops, as fenced out."""

    def __init__(self, message: str, current: int):
        super().__init__(message)
        self.current = current


class LeaseUnconfirmed(FencedOut):
    """Redis could not be reached until this attempt's lease may have expired: nothing proves the
    job is still this attempt's, so it stops committing nothing, as if fenced out. Infrastructure:
    the job is released or reaped, never failed."""


class RunningElsewhere(BatonError):
    """Another live ``baton run`` holds this job: this one starts nothing."""


class LocalStoreWarning(UserWarning):
    """A job queued with a ``file://`` store: only workers on this machine whose own store is that
    directory may run it (the others pass it on)."""


class JobNotFound(BatonError):
    """No job with this id exists."""


class CheckpointUnloadable(PermanentError):
    """A checkpoint whose bytes match the committed sha256 cannot be loaded here (another torch
    version, out of memory...): the environment is wrong, not the checkpoint. Never fall back from
    it or delete it."""


class CheckpointWriteFailed(BatonError):
    """The worker's machine could not write a checkpoint's local copy (its snapshot buffers or its
    spooled file): a full disk or tmpfs, an I/O error; or the process that writes it died (the OOM
    killer). The machine's fault, not the job's: the attempt is given up as a worker loss, counted
    against ``retry.max_attempts``, and the job resumes from its last committed checkpoint elsewhere.
    Only a store that cannot be reached is ``StorageUnavailable`` (released uncounted)."""


class CheckpointCancelled(BatonError):
    """The checkpoint in flight was cancelled (its attempt is over): it is not committed."""


class ConditionalWritesIgnored(PermanentError):
    """The object store accepted a conditional write it should have refused: the manifest's
    compare-and-swap would be a blind overwrite there, so no worker may run on it."""


def exception_chain(exc: "BaseException | None", follow_suppressed: bool = False) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, outermost first; a context
    hidden by ``raise ... from None`` only with ``follow_suppressed`` (to classify a failure by any
    cause, not to show one)."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        chain.append(exc)
        seen.add(id(exc))
        exc = exc.__cause__ or (None if exc.__suppress_context__ and not follow_suppressed else exc.__context__)
    return chain
