"""Where baton keeps a job's state, and how: the layout of a job's objects, the checkpoint format, the
manifest's fenced commit, rotation, reading what was committed, ``baton run``'s lease.

Rooms: ``stores`` (object stores), ``checkpointing`` (the asynchronous checkpointer and its writer),
``memory`` (the last step in host memory). Imports ``baton.schemas`` only."""
from baton.storage.stores.base import ObjectStore
from baton.storage.layout import JobPaths
from baton.storage.stores.open import open_store

__all__ = ["JobPaths", "ObjectStore", "open_store"]
