"""The commit protocol for ``manifest.json``: read, change, compare-and-swap.

The manifest records the highest attempt that wrote it. An attempt first *claims* the manifest
(raising its attempt number); from then on every write by an older attempt fails with FencedOut,
and two writers racing on one version cannot both win (the store's ``put_if``).
"""
from __future__ import annotations

import json
from typing import Callable, Optional

from schemas.errors import FencedOut, PreconditionFailed
from schemas.manifest import CheckpointManifest

from .base import ObjectStore
from .layout import JobPaths

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

    def update(self, attempt: int, mutate: Mutation) -> CheckpointManifest:
        """Apply ``mutate`` as ``attempt``; FencedOut if a newer attempt has written the manifest."""
        while True:
            manifest, version = self._read()
            if manifest.attempt > attempt:
                raise FencedOut(f"attempt {attempt} is stale: the manifest belongs to attempt {manifest.attempt}")
            mutate(manifest)
            manifest.attempt = attempt
            body = json.dumps(manifest.model_dump(mode="json"), indent=1).encode()
            try:
                self.store.put_if(self.paths.manifest, body, version)
                return manifest
            except PreconditionFailed:
                continue  # someone wrote in between: read again; a newer attempt fences us above
