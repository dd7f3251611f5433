"""Shipping code through the pool's server: the directory packed here, on the user's machine, exactly as
direct mode packs it (``code_ship.Shipper``: the same archive, digest, limits and checks of the spec's
targets against it), uploaded once under its digest (``PUT /api/code/DIGEST``, which the server checks
against the bytes), and the spec sent with ``code.digest`` in place of a directory the server cannot see."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from baton.jobs.code_ship import Shipper, code_dir, importable
from baton.jobs.specfile import check_user_targets, with_overrides
from baton.schemas.errors import SpecError
from baton.schemas.spec import JobSpec
from baton.storage.layout import CODE_PREFIX

if TYPE_CHECKING:
    from baton.jobs.server_client import ServerClient

UPLOAD_TIMEOUT_S = 600.0


class ServerCodeStore:
    """The part of an object store a ``Shipper`` uses, over the server's code routes."""

    def __init__(self, client: "ServerClient"):
        self.client, self.url = client, client.url

    @staticmethod
    def _digest(key: str) -> str:
        return key.removeprefix(CODE_PREFIX).removesuffix(".tar.gz").replace("-", ":", 1)

    def scratch_dir(self) -> Optional[Path]:
        return None

    def exists(self, key: str) -> bool:
        return bool(self.client.call("GET", f"/api/code/{self._digest(key)}")["exists"])

    def put_if(self, key: str, data: bytes, expected: Any) -> None:
        self.client.call("PUT", f"/api/code/{self._digest(key)}", data=data, timeout_s=UPLOAD_TIMEOUT_S)


def checked_here(raw: Any, directory: Optional[Path] = None) -> JobSpec:
    """The spec, valid, its targets found in ``directory`` (or installed here): checked here, where the
    directory is. Which modules the pool allows is the server's to say (its BATON_ALLOWED_MODULES)."""
    with importable(directory):
        spec = JobSpec.parse(raw)
        problems = [problem for _, problem in check_user_targets(spec) if problem is not None]
    if problems:
        raise SpecError(problems)
    return spec


def ship(client: "ServerClient", raw: Any, wanted: dict[str, Any], code: "str | Path | None",
         point: Optional[dict[str, Any]] = None) -> tuple[Any, dict[str, Any]]:
    """``raw`` and ``wanted`` (its overrides) with the code they ship (``code``, or a ``code.dir`` of the spec
    or of an override) packed, uploaded and named by its digest; as they are when they ship none. ``point``:
    a sweep's first point, for checking a spec that is whole only with one."""
    directory = Path(code) if code is not None else code_dir(with_overrides(raw, wanted))
    if directory is None:
        return raw, wanted
    parsed = checked_here(with_overrides(raw, {**wanted, **(point or {}), "code.dir": str(directory)}), directory)
    shipper = Shipper(ServerCodeStore(client), int(client.settings.code_limit_mb * 1e6))  # type: ignore[arg-type]
    digest = shipper.ship(parsed).code.digest  # type: ignore[union-attr]
    given = raw.get("code") if isinstance(raw.get("code"), dict) else {}
    section = {**{k: v for k, v in given.items() if k != "dir"}, "digest": digest}
    return {**raw, "code": section}, {path: value for path, value in wanted.items() if path != "code.dir"}
