"""Downloading a job's artifacts from its store (``Job.download``, ``baton download``): checkpoints and
final files verified against the sha256 their manifest entries hold, the code it shipped checked against
its digest, and every attempt's TensorBoard event files."""
from __future__ import annotations

import hashlib
from pathlib import Path

from baton.schemas.errors import CheckpointCorrupt
from baton.schemas.spec import JobSpec
from baton.storage.artifacts import download_checkpoint, download_verified, final_files
from baton.storage.layout import JobPaths, code_key, is_side_output
from baton.storage.manifest_store import ManifestStore
from baton.storage.stores.base import ObjectStore

WHICH = ("best", "latest", "final", "tensorboard", "code")


def download(store: ObjectStore, job_id: str, directory: str | Path = ".", which: str = "best") -> Path:
    """``Job.download`` from ``store`` itself, with no record in Redis (a ``baton run`` job):
    FileNotFoundError when the store holds no such job."""
    if which not in WHICH:
        raise ValueError(f"which must be one of {WHICH} (got {which!r})")
    paths = JobPaths(job_id)
    if which == "code":
        return _download_code(store, paths, Path(directory) / job_id)
    if not store.exists(paths.manifest):
        store.list(paths.root)  # (a missing bucket, or an endpoint that is not S3, says so here: not "no job")
        raise FileNotFoundError(f"no job {job_id!r} under {store.url}/{paths.root}")
    manifest = ManifestStore(store, paths).read()
    out = Path(directory) / job_id
    out.mkdir(parents=True, exist_ok=True)
    if which == "final":
        for name, ref in final_files(manifest).items():
            download_verified(store, ref, out / name)
        return out
    if which == "tensorboard":
        return _download_event_files(store, paths, out / "tensorboard")
    entry = manifest.best if which == "best" else manifest.latest
    if entry is None:
        raise FileNotFoundError(f"job {job_id} has no {which} checkpoint yet")
    name = Path(entry.key).name if which == "latest" else ("best" if entry.files is not None else "best.pt")
    return download_checkpoint(store, entry, out / name)


def _download_code(store: ObjectStore, paths: JobPaths, out: Path) -> Path:
    """The archive of the code the job ships (checked against its digest), as ``code-<hex>.tar.gz``."""
    try:
        spec = JobSpec.model_validate_json(store.get_bytes(paths.spec))
    except FileNotFoundError:
        raise FileNotFoundError(f"no job {paths.job_id!r} under {store.url}/{paths.root}") from None
    digest = spec.code.digest if spec.code is not None else None
    if digest is None:
        raise FileNotFoundError(f"job {paths.job_id} ships no code: it imports what its workers have installed")
    data = store.get_bytes(code_key(digest))
    if f"sha256:{hashlib.sha256(data).hexdigest()}" != digest:
        raise CheckpointCorrupt(f"{code_key(digest)}: does not match the job's code.digest {digest}")
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"code-{digest.split(':')[1]}.tar.gz"
    target.write_bytes(data)
    return target


def _download_event_files(store: ObjectStore, paths: JobPaths, out: Path) -> Path:
    """Every attempt's TensorBoard event files, one directory per attempt (``tensorboard --logdir``
    on ``out`` shows the job's run whole: each step is in one attempt's file only)."""
    keys = [key for key in store.list(paths.attempts) if is_side_output(key) and "/tensorboard/" in key]
    if not keys:
        raise FileNotFoundError(f"job {paths.job_id} has no TensorBoard event files (is baton[tensorboard] "
                                "installed where it trained?)")
    for key in keys:
        attempt, name = key.split("/")[-3], key.rsplit("/", 1)[1]
        (out / attempt).mkdir(parents=True, exist_ok=True)
        store.get_file(key, out / attempt / name)
    return out
