"""Shipping a job's code at submit: its ``code.dir`` packed (``code_pack``), stored once under its
digest (a sweep's trials, and any job shipping the same files, share one archive), and the spec
given that digest, which every attempt of the job on every worker then runs."""
from __future__ import annotations

import contextlib
import importlib
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

from baton.schemas.errors import PreconditionFailed, SpecError
from baton.schemas.spec import JobSpec
from baton.storage.layout import code_key
from baton.storage.stores.base import ObjectStore

from baton.jobs.code_pack import pack


def code_dir(raw: Any) -> Optional[Path]:
    """The directory a raw spec ships (``code.dir``), as given; None when it ships none."""
    code = raw.get("code") if isinstance(raw, dict) else None
    directory = code.get("dir") if isinstance(code, dict) else None
    return Path(directory) if isinstance(directory, str) else None


@contextlib.contextmanager
def importable(directory: Optional[Path]) -> Iterator[None]:
    """While checking a spec's targets: ``directory`` first on the import path, as on the worker."""
    if directory is None or not directory.is_dir():
        yield
        return
    entry = str(directory.resolve())
    sys.path.insert(0, entry)
    importlib.invalidate_caches()
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)
        sys.path_importer_cache.pop(entry, None)


class Shipper:
    """Packs and stores the code of the specs given to it, each directory once (a sweep's trials)."""

    def __init__(self, store: ObjectStore, limit_bytes: int):
        self.store, self.limit_bytes = store, limit_bytes
        self._digests: dict[tuple[Path, tuple[str, ...]], str] = {}

    def ship(self, spec: JobSpec) -> JobSpec:
        """``spec`` with its code's digest (its directory packed and stored if not yet), or as it is when
        it ships no directory."""
        code = spec.code
        if code is None or code.dir is None:
            if code is not None and code.digest is not None and not self.store.exists(code_key(code.digest)):
                raise SpecError([f"code.digest: the store {self.store.url} holds no archive {code.digest} (give "
                                 "code.dir to ship the directory again)"])
            return spec
        directory = Path(code.dir).resolve()
        known = (directory, code.exclude)
        if known not in self._digests:
            packed = pack(directory, code.exclude, self.limit_bytes)
            key = code_key(packed.digest)
            if not self.store.exists(key):
                with contextlib.suppress(PreconditionFailed):  # stored meanwhile by another client: the same bytes
                    self.store.put_if(key, packed.data, None)
            self._digests[known] = packed.digest
        shipped = code.model_copy(update={"dir": str(directory), "digest": self._digests[known]})
        return spec.model_copy(update={"code": shipped})
