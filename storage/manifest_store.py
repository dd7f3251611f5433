"""The commit protocol for ``manifest.json``: read, change, compare-and-swap.

The manifest records the highest attempt that wrote it, and the nonce of the claim holding that
attempt (together, the fencing token). An attempt first *claims* the manifest (raising its attempt
number, recording its nonce); from then on every write by an older attempt fails with FencedOut,
and so does a second claim of the same number with another nonce (two workers can hold one
attempt number when Redis loses a claim or comes back behind the manifest). A claim is an
attempt's first write, before any of its objects, so the claim that loses writes nothing. Two
writers racing on one version cannot both win (the store's ``put_if``).
"""
from __future__ import annotations

import json
from typing import Callable, Optional

from baton.schemas.errors import ManifestAhead, PreconditionFailed
from baton.schemas.manifest import CheckpointManifest

from baton.storage import failpoints
from baton.storage.stores.base import ObjectStore
from baton.storage.layout import JobPaths

Mutation = Callable[[CheckpointManifest], None]


class ManifestStore:
    def __init__(self, store: ObjectStore, paths: JobPaths):
        self.store = store
        self.paths = paths

    def read(self) -> CheckpointManifest:
        return self._read()[0]

    def _read(self) -> tuple[CheckpointManifest, Optional[str]]:
        found = self.store.read_versioned(self.paths.manifest)
        if found is None:
            return CheckpointManifest(job_id=self.paths.job_id), None
        data, version = found
        return CheckpointManifest.model_validate_json(data), version

    def update(self, attempt: int, mutate: Mutation, claim: Optional[str] = None) -> CheckpointManifest:
        """Apply ``mutate`` as ``attempt``; ManifestAhead (a FencedOut) if a newer attempt has written the
        manifest, or, given the ``claim`` nonce, if another claim holds this attempt number."""
        failpoints.pause("commit", self.paths.job_id)  # a test's hold (failpoints.py); nothing otherwise
        while True:
            manifest, version = self._read()
            if manifest.attempt > attempt:
                raise ManifestAhead(f"attempt {attempt} is stale: the manifest belongs to attempt {manifest.attempt}",
                                    manifest.attempt)
            if (claim is not None and manifest.attempt == attempt and manifest.claim is not None
                    and manifest.claim != claim):
                raise ManifestAhead(f"attempt {attempt} is held by another claim ({manifest.claim}; this one is "
                                    f"{claim})", manifest.attempt)
            mutate(manifest)
            if manifest.attempt != attempt:
                manifest.claim = None  # the previous attempt's nonce means nothing to this one
            manifest.attempt = attempt
            if claim is not None:
                manifest.claim = claim
            body = json.dumps(manifest.model_dump(mode="json"), indent=1).encode()
            try:
                self.store.put_if(self.paths.manifest, body, version)
                return manifest
            except PreconditionFailed:
                continue  # someone wrote in between: read again; a newer attempt fences us above
