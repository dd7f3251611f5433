"""Whether a worker may run a job on the store its record names: only on one it has probed.

A job's record carries the store its client wrote the spec to. A worker probed its own store at
start-up (``worker_main.check_storage``); any other store it probes before the claim, once per URL,
and on every store it looks for the job's spec.json, which the client wrote at submit: a store
that does not hold it here is not the client's store, seen from this machine. A ``file://`` store is
one machine's directory, so a worker takes one only if it is its own ``BATON_STORAGE_URL``: a job
submitted with the client's local default would otherwise run on each worker's own disk, resume
from nothing after a loss, and leave the client nothing to fetch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional
from urllib.parse import urlparse

from baton.schemas.errors import BatonError, TransientError
from baton.storage.conditional_probe import check_conditional_writes
from baton.storage.layout import JobPaths
from baton.storage.stores.open import open_store


def _local_dir(url: str) -> Optional[Path]:
    """A file:// URL's directory, resolved as FileStore resolves it (without creating it)."""
    parsed = urlparse(url)
    return Path(parsed.netloc + parsed.path).resolve() if parsed.scheme == "file" else None


class StoreChecks:
    """One worker's verdicts on the stores jobs name (probes that passed are remembered)."""

    def __init__(self, own_url: str):
        self.own_url = own_url
        self._probed: set[str] = {own_url}

    def refusal(self, job_id: str, url: str) -> Optional[str]:
        """Why this worker must not run ``job_id`` on ``url``; None when it may, or when the store
        cannot be reached now (the attempt then releases the job as storage unavailable)."""
        directory = _local_dir(url)
        if directory is not None and directory != _local_dir(self.own_url):
            return (f"its store {url} is a directory on the submitting machine, and this worker's store is "
                    f"{self.own_url}: submit queue jobs to a store every worker shares (s3://...)")
        if directory is not None and not directory.is_dir():
            return f"its store {url} does not exist on this machine"
        try:
            store = open_store(url)
            if url not in self._probed:
                check_conditional_writes(store)
                self._probed.add(url)
            if not store.exists(JobPaths(job_id).spec):
                return (f"its store {url} does not hold its spec ({JobPaths(job_id).spec}) as seen from this "
                        "machine: is it the store the job was submitted to?")
        except TransientError:
            return None
        except (BatonError, ValueError) as exc:
            return f"its store {url} cannot be used here: {exc}"
        return None
