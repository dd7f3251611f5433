"""Pydantic models only: the job spec and its parts, statuses, manifests, metrics rows. No I/O."""
from baton.schemas.errors import SpecError
from baton.schemas.manifest import BestEntry, CheckpointEntry, CheckpointManifest
from baton.schemas.metrics import MetricsRow
from baton.schemas.settings import BatonSettings
from baton.schemas.spec import JobSpec

__all__ = ["BatonSettings", "BestEntry", "CheckpointEntry", "CheckpointManifest", "JobSpec", "MetricsRow", "SpecError"]
