"""Object stores (s3://, file://), the checkpoint format, the async checkpointer, the manifest commit."""
from .base import ObjectStore
from .layout import JobPaths
from .open import open_store

__all__ = ["JobPaths", "ObjectStore", "open_store"]
