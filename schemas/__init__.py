"""Pydantic models only: the job spec and its parts, statuses, manifests, metrics rows. No I/O."""
from .errors import SpecError
from .manifest import BestEntry, CheckpointEntry, CheckpointManifest
from .metrics import MetricsRow
from .settings import BatonSettings
from .spec import JobSpec

__all__ = ["BatonSettings", "BestEntry", "CheckpointEntry", "CheckpointManifest", "JobSpec", "MetricsRow", "SpecError"]
