"""``s3://bucket/prefix`` through boto3: AWS S3, MinIO, or any S3-compatible endpoint.

Endpoint, region and credentials come from boto3's own sources: the standard AWS_* variables
(AWS_ENDPOINT_URL for MinIO or a local endpoint, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_DEFAULT_REGION) and ~/.aws config files. Nothing of this is in a spec, a log or a status.

Errors are translated where they enter: a missing object is FileNotFoundError; throttling,
5xx and connection trouble are retried here for ``RETRY_S``, then raised as StorageUnavailable;
refused credentials are AccessDenied. botocore makes one attempt per call: its own backoff draws
from the global ``random`` (and so would s3transfer's temporary download names), which would
change the python RNG state of the training job in this process. Large files go multipart through boto3's TransferConfig.
The manifest's compare-and-swap uses S3 conditional writes (If-Match / If-None-Match).
"""
from __future__ import annotations

import io
import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional, TypeVar
from urllib.parse import urlparse

import boto3
from boto3.exceptions import RetriesExceededError, S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

from baton.schemas.errors import AccessDenied, PermanentError, PreconditionFailed, StorageUnavailable, StoreUnusable

from baton.storage.stores.base import ObjectStore
from baton.storage.stores.retry import retry_transient

T = TypeVar("T")

MULTIPART_CHUNK_BYTES = 16 * 1024 * 1024
"""Multipart part size and threshold: objects above it are uploaded in parts, in parallel."""
TRANSFER_THREADS = 8
"""Parallel part uploads/downloads per transfer."""
RETRY_S = 20.0
"""How long one call is retried through transient errors before StorageUnavailable is raised."""
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 60

_MISSING = {"404", "NoSuchKey", "NotFound"}
_DENIED = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"}
_PRECONDITION = {"412", "PreconditionFailed", "409", "ConditionalRequestConflict"}
_TRANSIENT = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed",
              "InternalError", "ServiceUnavailable", "503", "500", "502", "504"}


def _client_error(exc: ClientError, what: str) -> Exception:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    if code in _MISSING:
        return FileNotFoundError(what)
    if code in _DENIED:
        return AccessDenied(f"{what}: access denied ({code}); check the AWS credentials and the bucket policy")
    if code in _PRECONDITION:
        return PreconditionFailed(f"{what}: changed since it was read")
    if code == "NotImplemented" or status == 501 or status >= 505:  # an HTTP server, but not an S3 endpoint
        return StoreUnusable(f"{what}: the endpoint answered {code or status}: it does not speak S3 there; check "
                             "AWS_ENDPOINT_URL")
    if code in _TRANSIENT or status >= 500:
        return StorageUnavailable(f"{what}: {code or status}")
    if code == "NoSuchBucket":
        return StoreUnusable(f"{what}: the bucket does not exist")
    return PermanentError(f"{what}: {code or status}: {exc}")


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """Translate boto3/botocore errors raised inside the block (see the module docstring)."""
    try:
        yield
    except ClientError as exc:
        raise _client_error(exc, what) from exc
    except S3UploadFailedError as exc:  # boto3 wraps a ClientError of a transfer in this
        cause = exc.__context__
        if isinstance(cause, ClientError):
            raise _client_error(cause, what) from exc
        raise StorageUnavailable(f"{what}: {exc}") from exc
    except (NoCredentialsError, PartialCredentialsError) as exc:  # no retry finds credentials that are not there
        raise StoreUnusable(f"{what}: no AWS credentials found ({exc}); set AWS_ACCESS_KEY_ID and "
                            "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE") from exc
    except (RetriesExceededError, BotoCoreError) as exc:  # connection refused/closed, timeouts
        raise StorageUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc


class S3Store(ObjectStore):
    def __init__(self, bucket: str, prefix: str = "", client=None, retry_s: Optional[float] = None,
                 retry_log: Optional[Callable[[str], None]] = None):
        """``retry_s``: how long a call is retried through transient errors (a command a person waits on
        gives up sooner than a worker does); the connect timeout is never longer. ``retry_log``: where
        each retry is said (default: the ``baton.storage`` logger's warnings)."""
        self.bucket = bucket
        self.retry_s = retry_s = RETRY_S if retry_s is None else retry_s  # (read now: a test may shorten it)
        self.retry_log = retry_log
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._own_client = client is None  # configured from the environment alone: reopenable by URL
        self.client = client or boto3.client("s3", config=Config(
            retries={"mode": "standard", "total_max_attempts": 1},  # one try: we retry (see above)
            connect_timeout=min(CONNECT_TIMEOUT_S, retry_s), read_timeout=READ_TIMEOUT_S,
        ))
        self.transfer = TransferConfig(multipart_threshold=MULTIPART_CHUNK_BYTES, multipart_chunksize=MULTIPART_CHUNK_BYTES,
                                       max_concurrency=TRANSFER_THREADS)

    def reopen_url(self) -> Optional[str]:
        return self.url if self._own_client and type(self) is S3Store else None

    @classmethod
    def from_url(cls, url: str, retry_s: Optional[float] = None,
                 retry_log: Optional[Callable[[str], None]] = None) -> "S3Store":
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ValueError(f"S3 storage URL must be s3://bucket[/prefix] (got {url!r})")
        return cls(parsed.netloc, parsed.path, retry_s=retry_s, retry_log=retry_log)

    def _key(self, key: str) -> str:
        if not key or key.startswith("/"):
            raise ValueError(f"invalid object key {key!r}")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _where(self, key: str) -> str:
        return f"{self.url}/{key}"

    def _call(self, key: str, fn: Callable[[], T]) -> T:
        """``fn()`` with its errors translated, retried through transient ones for RETRY_S."""
        def attempt() -> T:
            with _translated(self._where(key)):
                return fn()
        return retry_transient(attempt, self.retry_s, self._where(key), self.retry_log)

    def put_bytes(self, key: str, data: bytes) -> None:
        if len(data) > MULTIPART_CHUNK_BYTES:
            self._call(key, lambda: self.client.upload_fileobj(io.BytesIO(data), self.bucket, self._key(key),
                                                               Config=self.transfer))
        else:
            self._call(key, lambda: self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data))

    def put_file(self, key: str, path: Path, consume: bool = False) -> None:
        self._call(key, lambda: self.client.upload_file(str(path), self.bucket, self._key(key), Config=self.transfer))

    def get_bytes(self, key: str) -> bytes:
        return self._call(key, lambda: self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read())

    def get_file(self, key: str, path: Path) -> None:
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")

        def download() -> None:
            with open(tmp, "wb") as fh:
                self.client.download_fileobj(self.bucket, self._key(key), fh, Config=self.transfer)
        try:
            self._call(key, download)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def size(self, key: str) -> int:
        return self._call(key, lambda: self.client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"])

    def list(self, prefix: str) -> list[str]:
        full = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        strip = len(f"{self.prefix}/") if self.prefix else 0

        def listing() -> list[str]:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full)
            return sorted(obj["Key"][strip:] for page in pages for obj in page.get("Contents", []))
        try:
            return self._call(prefix, listing)
        except FileNotFoundError:  # a listing finds nothing or something, never "not found": S3 says NoSuchBucket
            raise StoreUnusable(f"{self._where(prefix)}: the endpoint answered 404 to a listing: no such bucket, or "
                                "not an S3 endpoint; check BATON_STORAGE_URL and AWS_ENDPOINT_URL") from None

    def delete(self, key: str) -> None:
        self._call(key, lambda: self.client.delete_object(Bucket=self.bucket, Key=self._key(key)))

    def copy(self, src: str, dst: str) -> None:
        source = {"Bucket": self.bucket, "Key": self._key(src)}
        self._call(src, lambda: self.client.copy(source, self.bucket, self._key(dst), Config=self.transfer))

    def read_versioned(self, key: str) -> Optional[tuple[bytes, str]]:
        def read() -> tuple[bytes, str]:
            found = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            return found["Body"].read(), found["ETag"]
        try:
            return self._call(key, read)
        except FileNotFoundError:
            return None

    def put_if(self, key: str, data: bytes, version: Optional[str]) -> None:
        # A retry after a lost response can meet our own write: PreconditionFailed then, and the
        # manifest store re-reads and re-applies its (idempotent) change.
        condition = {"IfMatch": version} if version is not None else {"IfNoneMatch": "*"}
        self._call(key, lambda: self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **condition))
