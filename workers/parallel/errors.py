"""How the other ranks of a data-parallel attempt end it, as rank 0 reports it: a loss (retried) or
the job's own failure (not retried)."""
from __future__ import annotations

from baton.schemas.errors import BatonError, UserCodeError


class RankLost(BatonError):
    """A rank of a data-parallel attempt died (a signal, out of memory, its process gone) or its group
    broke: infrastructure, so the job is retried as a worker loss."""


class RankFailed(UserCodeError):
    """The job's own code (or its spec) raised on a rank other than 0: the job fails and is not retried,
    as a single-process job whose code raises. ``traceback`` is the rank's own, ``origin`` names the rank."""


class NodeReleased(BatonError):
    """Another node of a multi-node attempt is shutting down (SIGTERM: a spot notice, a pod deleted)
    before its ranks could stop with the others: the job is released for another gang, not counted."""
