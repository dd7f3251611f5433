"""A rank's report that the job's own code failed there, for rank 0 to record as the job's failure.

A rank's exit status alone cannot tell the job's code raising from the rank being lost, and says
nothing of the exception. So a rank whose code raises writes the exception, its traceback formatted
and redacted, to a file in the attempt's private directory (created by rank 0, readable by this
user only), then exits with ``EXIT_USER_CODE``. It writes the report before it leaves the group:
the other ranks notice a failure by their connections to it closing, and rank 0 must find the report
by then.

Storage and the group itself failing under a rank are not the job's code: such a rank writes no
report and rank 0 counts it lost.
"""
from __future__ import annotations

import json
import os
import stat
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from baton.storage.redaction import Redactor
from baton.schemas.errors import CheckpointCorrupt, CheckpointWriteFailed, TransientError, exception_chain

from baton.workers.parallel.errors import RankLost

EXIT_USER_CODE = 65
"""A rank's exit status after it reported a failure of the job's code (or spec): the job fails, no retry."""


@dataclass(frozen=True)
class FailureReport:
    rank: int
    at_ns: int
    """When the rank reported it (CLOCK_MONOTONIC, one clock for the node's processes): the earliest
    report is the cause; a later one may be a rank whose collective broke because of it."""
    exception: str
    """``ValueError: ...``: the exception's type and message."""
    traceback: str


def is_job_failure(exc: BaseException) -> bool:
    """Whether ``exc``, raised on a rank, is the job's code (or spec) failing, rather than storage or
    the process group failing under the rank (another rank lost, or not proving the attempt's secret)."""
    from baton.workers.parallel.launcher import is_collective_error

    infrastructure = (TransientError, CheckpointCorrupt, CheckpointWriteFailed, RankLost)
    return not any(isinstance(e, infrastructure) or is_collective_error(e)
                   for e in exception_chain(exc, follow_suppressed=True))


_REPORT = TypeAdapter(FailureReport)
MAX_BYTES = 4 << 20
"""The largest report read (a traceback of a deep recursion is a few hundred KiB)."""


def write(directory: Path, rank: int, exc: BaseException) -> None:
    """Report ``exc`` as rank ``rank``'s failure (atomically: rank 0 never reads half a report)."""
    redact = Redactor()
    report = {"rank": rank, "at_ns": time.monotonic_ns(), "exception": redact(f"{type(exc).__name__}: {exc}"),
              "traceback": redact("".join(traceback.format_exception(exc)))}
    path = report_path(directory, rank)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(report))
    os.replace(partial, path)


def read_earliest(directory: Path) -> "FailureReport | None":
    """The first failure any rank reported in ``directory``, or None. A rank runs the job's code, which
    can write anything there: what is not a report of this module's shape, within ``MAX_BYTES``, is
    skipped (the rank's exit status still says it failed)."""
    reports = []
    for path in directory.glob("failure-rank-*.json"):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)  # (never a link, a FIFO's writer)
            with open(fd, "rb") as raw:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue
                data = raw.read(MAX_BYTES + 1)
            if len(data) <= MAX_BYTES:
                reports.append(_REPORT.validate_json(data, strict=True))
        except (OSError, ValidationError):
            continue
    return min(reports, key=lambda r: r.at_ns, default=None)


def report_path(directory: Path, rank: int) -> Path:
    return directory / f"failure-rank-{rank}.json"

