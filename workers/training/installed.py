"""Whether a job's targets may be imported here, and are installed, without importing anything of theirs
(a worker's main process asks this of every job it meets: it must not import torch's tasks, metrics or
models to answer)."""
from __future__ import annotations

import importlib.util
from typing import Optional

from baton.schemas.targets import module_allowed, parse_target


def unavailable(targets: dict[str, str], allowed_prefixes: tuple[str, ...], installed: bool = True) -> Optional[str]:
    """Why this process could not import one of a job's targets (``{"model.target": "pkg.mod:fn"}``):
    its module is outside this process's allowlist, or (``installed``: the job ships no code of its own)
    its package is not installed here. None if every one may be imported. Imports nothing (a top-level
    package is only looked up)."""
    for field, text in targets.items():
        target = parse_target(text)
        if target.is_builtin:
            continue
        if not module_allowed(target.module, allowed_prefixes):
            allowed = ",".join(allowed_prefixes) or "(unset)"
            return f"{field}: module {target.module!r} is not allowed here (BATON_ALLOWED_MODULES={allowed})"
        if not installed:
            continue
        package = target.module.split(".")[0]
        try:
            found = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return (f"{field}: package {package!r} is not installed here (install it on the workers, or ship it with "
                    "the job: `baton submit --code`)")
    return None
