"""Object stores (s3://, file://), the checkpoint format, the async checkpointer, the manifest commit."""
from baton.storage.base import ObjectStore
from baton.storage.layout import JobPaths
from baton.storage.open import open_store

__all__ = ["JobPaths", "ObjectStore", "open_store"]
