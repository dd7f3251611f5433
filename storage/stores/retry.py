"""Retrying TransientError with exponential backoff and jitter, within a time budget.

The jitter comes from a private generator: drawing from the global ``random`` here (as botocore's
own retries do) would change the python RNG state a training job's code sees, and with it the
job's result, whenever storage hiccups.
"""
from __future__ import annotations

import logging
import random
import time
from typing import Callable, Optional, TypeVar

from baton.schemas.errors import TransientError

T = TypeVar("T")
_jitter = random.Random()
_log = logging.getLogger("baton.storage")

FIRST_DELAY_S = 0.2
"""Wait before the first retry; doubles each time."""
MAX_DELAY_S = 10.0
"""Longest wait between two tries."""


def retry_transient(fn: Callable[[], T], budget_s: float, what: str, log: Optional[Callable[[str], None]] = None) -> T:
    """Call ``fn`` until it does not raise TransientError or ``budget_s`` has passed (then re-raise).
    Each retry is reported to ``log`` (default: the ``baton.storage`` logger, at WARNING)."""
    log = log or _log.warning
    deadline = time.monotonic() + budget_s
    delay = FIRST_DELAY_S
    while True:
        try:
            return fn()
        except TransientError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            wait = min(delay, MAX_DELAY_S, left) * _jitter.uniform(0.5, 1.0)
            log(f"{what}: {exc}; retrying in {wait:.1f}s")
            time.sleep(wait)
            delay *= 2
