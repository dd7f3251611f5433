"""Shipping a job's code at submit: its ``code.dir`` packed (``code_pack``), stored once under its
digest (a sweep's trials, and any job shipping the same files, share one archive), and the spec
given that digest, which every attempt of the job on every worker then runs."""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

from baton.schemas.errors import PreconditionFailed, SpecError
from baton.schemas.spec import JobSpec
from baton.schemas.targets import parse_target
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


def not_the_servers(path: str) -> str:
    """Why ``path`` (code.dir, or a grid axis holding it) is refused through the pool's server."""
    return (f"{path}: through the pool's server, this names a directory of the server's machine; ship your code "
            "with `--code DIR` (packed on your machine and uploaded), or name an archive the store holds (code.digest)")


class Shipper:
    """Packs and stores the code of the specs given to it, each directory once (a sweep's trials)."""

    def __init__(self, store: ObjectStore, limit_bytes: int, local_dirs: bool = True):
        """``local_dirs``: whether a code.dir of this machine may be packed (never for the pool's server)."""
        self.store, self.limit_bytes, self.local_dirs = store, limit_bytes, local_dirs
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
        if not self.local_dirs:
            raise SpecError([not_the_servers("code.dir")])
        directory = Path(code.dir).resolve()
        known = (directory, code.exclude)
        if known not in self._digests:
            self._refuse_holding_the_store(directory)
            packed = pack(directory, code.exclude, self.limit_bytes)
            _refuse_missing_packages(spec, directory, packed.tops)
            key = code_key(packed.digest)
            if not self.store.exists(key):
                with contextlib.suppress(PreconditionFailed):  # stored meanwhile by another client: the same bytes
                    self.store.put_if(key, packed.data, None)
            self._digests[known] = packed.digest
        shipped = code.model_copy(update={"dir": str(directory), "digest": self._digests[known]})
        return spec.model_copy(update={"code": shipped})

    def _refuse_holding_the_store(self, directory: Path) -> None:
        """A directory holding the job store itself (a file:// store under it): the parent of a project,
        submitted from the wrong place."""
        local = self.store.scratch_dir()
        root = Path(self.store.url.removeprefix("file://")).resolve() if self.store.url.startswith("file://") else None
        for inside in filter(None, [root, local]):
            if inside.is_relative_to(directory):
                raise SpecError([f"code.dir: {directory} holds the job store ({self.store.url}); ship your project's "
                                 "directory (a relative code.dir is taken from where you submit)"])


def _refuse_missing_packages(spec: JobSpec, directory: Path, tops: frozenset[str]) -> None:
    """A target whose package is not in the shipped directory would fail on every worker that lacks it:
    said at submit when it is not installed here either, and always when the directory is that package's
    own folder (the usual slip: not the one holding it; installed here, it would still fail on the
    workers, where only the shipped directory is on the path)."""
    problems = []
    for field, text in spec.user_targets().items():
        target = parse_target(text)
        package = target.module.split(".")[0]
        if target.is_builtin or package in tops:
            continue
        if directory.name == package and (directory / "__init__.py").exists():  # (installed here or not)
            problems.append(f"{field}: code.dir ({directory}) is the package {package!r} itself: ship its parent, "
                            f"{directory.parent} (code.dir must be the directory that holds {package}/)")
        elif not _installed(package):
            problems.append(f"{field}: package {package!r} is neither in code.dir ({directory}) nor installed here; "
                            f"code.dir must be the directory that holds {package}/")
    if problems:
        raise SpecError(problems)


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False
