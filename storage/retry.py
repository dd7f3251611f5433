"""Retrying TransientError with exponential backoff and jitter, within a time budget."""
from __future__ import annotations

import random
import time
from typing import Callable, TypeVar

from schemas.errors import TransientError

T = TypeVar("T")

FIRST_DELAY_S = 0.2
"""Wait before the first retry; doubles each time."""
MAX_DELAY_S = 10.0
"""Longest wait between two tries."""


def retry_transient(fn: Callable[[], T], budget_s: float, what: str, log: Callable[[str], None] = lambda m: None) -> T:
    """Call ``fn`` until it does not raise TransientError or ``budget_s`` has passed (then re-raise)."""
    deadline = time.monotonic() + budget_s
    delay = FIRST_DELAY_S
    while True:
        try:
            return fn()
        except TransientError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            wait = min(delay, MAX_DELAY_S, left) * random.uniform(0.5, 1.0)
            log(f"{what}: {exc}; retrying in {wait:.1f}s")
            time.sleep(wait)
            delay *= 2
