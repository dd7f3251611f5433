"""``open_store(url)``: the one way every component gets an ObjectStore."""
from __future__ import annotations

from urllib.parse import urlparse

from .base import ObjectStore
from .file_store import FileStore


def open_store(url: str) -> ObjectStore:
    """``file:///abs/path``, ``file://./rel/path`` or ``s3://bucket[/prefix]``."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        path = parsed.netloc + parsed.path  # file://./baton-data keeps its relative path
        if not path:
            raise ValueError(f"storage URL {url!r} has no path")
        return FileStore(path)
    if parsed.scheme == "s3":
        from .s3_store import S3Store  # boto3 is imported only when S3 is used

        return S3Store.from_url(url)
    raise ValueError(f"storage URL must start with file:// or s3:// (got {url!r})")
