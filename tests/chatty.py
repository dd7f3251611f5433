"""User code that talks: a data set that prints to stdout and stderr, logs through Python logging
and prints secrets from its environment, as real training code does. Imported by jobs as
``tests.chatty:chatty_spiral`` (for ``baton logs`` and its redaction)."""
from __future__ import annotations

import logging
import os
import sys

from torch.utils.data import Dataset

from tests.probes import slow_spiral

_log = logging.getLogger("chatty.user")
EVERY = 200
"""Samples between two rounds of chatter (a few per epoch)."""


class Chatty(Dataset):
    def __init__(self, base: Dataset):
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        if index % EVERY == 0:  # in a DataLoader worker process when num_workers > 0
            print(f"chatty: stdout sample {index} in pid {os.getpid()}", flush=True)
            print(f"chatty: stderr sample {index}", file=sys.stderr, flush=True)
            _log.warning("chatty: logging sample %d", index)
            print(f"chatty: my token is {os.environ.get('MY_API_TOKEN')} and my redis is "
                  f"redis://:{os.environ.get('MY_REDIS_PASSWORD')}@db.internal:6379/0", flush=True)
        return self.base[index]


def chatty_spiral(seed: int = 0, delay_s: float = 0.003, **kwargs) -> Dataset:
    return Chatty(slow_spiral(seed=seed, delay_s=delay_s, **kwargs))
