"""Installing a job's ``code.pip`` packages on a worker, beside its environment and never over it.

The set is resolved against the worker's own environment (``pip install --dry-run --report``: what is
installed here satisfies what it can); a resolution that would replace an installed distribution
(torch, baton, or anything baton itself imports) is refused. What is missing is installed, exactly
those versions and nothing else (``--no-deps``), into a directory of its own; one that then holds a
module that would hide one the worker has is refused too (a namespace package such as ``google`` merges
with the worker's: only the names inside it are compared). Either refusal, and a version
that does not exist, fails the job (``PackagesFailed``); a package index this worker cannot reach is
this worker's problem (``PackagesUnreachable``: a loss here, retried on another worker).
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Optional

from packaging.utils import canonicalize_name

from baton.schemas.code import PROTECTED
from baton.schemas.errors import BatonError, PermanentError

PIP_TIMEOUT_S = 900.0
"""The longest an install of a job's packages may take (a package index that stops answering)."""
OUTPUT_LINES = 15
"""How much of pip's output a failure quotes."""
UNREACHABLE = ("NewConnectionError", "ConnectTimeout", "Max retries exceeded", "Temporary failure in name resolution",
               "Network is unreachable", "Connection refused", "ReadTimeoutError")
"""pip's words for a package index it could not reach."""


class PackagesFailed(PermanentError):
    """The job's ``code.pip`` cannot be installed here (no such version, or it would replace what the
    worker runs on): the job fails, saying why."""


class PackagesUnreachable(BatonError):
    """No package index answered this worker: a loss on this worker, counted; another may reach one."""


def install(requirements: tuple[str, ...], into: Path) -> list[tuple[str, str]]:
    """Install what ``requirements`` add to this environment into ``into`` (an empty directory); what
    was installed, as (name, version)."""
    report = into / "report.json"
    _pip(["install", "--dry-run", "--quiet", "--report", str(report), *requirements], "resolve")
    missing = [(item["metadata"]["name"], item["metadata"]["version"])
               for item in json.loads(report.read_text()).get("install", [])]
    report.unlink()
    wanted = " ".join(requirements)
    replaced = [f"{name} {_installed(name)} with {version}" for name, version in missing
                if canonicalize_name(name) in PROTECTED or _installed(name) is not None]
    if replaced:
        raise PackagesFailed(f"code.pip {wanted}: would replace the worker's own {'; '.join(replaced)}; ask for "
                             "versions the worker's environment has, or leave those packages out")
    if missing:
        _pip(["install", "--no-deps", "--no-compile", "--target", str(into),
              *[f"{name}=={version}" for name, version in missing]], "install")
    shadowing = shadowed(into)
    if shadowing:
        raise PackagesFailed(f"code.pip {wanted}: installs module(s) {', '.join(shadowing)}, which the worker's own "
                             "packages provide")
    return missing


def _installed(name: str):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def shadowed(overlay: Path) -> list[str]:
    """The modules of ``overlay`` that would hide one of the worker's own: a top-level name its packages or
    Python's standard library provide (torch and baton always), unless both are namespace packages (PEP 420: ``google``, say), whose
    portions merge; then the same question is asked of the names inside."""
    provided = set(metadata.packages_distributions()) | set(PROTECTED) | set(sys.stdlib_module_names)
    found: list[str] = []
    for name, path in _modules(overlay).items():
        if name in provided:
            found += _clashes(name, path, _namespace_portions(name))
    return sorted(found)


def _modules(directory: Path) -> dict[str, Path]:
    """The importable names ``directory`` holds (a package's directory, a module's file), each with its path."""
    names: dict[str, Path] = {}
    for path in directory.iterdir():
        if path.name.endswith((".dist-info", ".egg-info", ".data")) or path.name in ("bin", "__pycache__"):
            continue
        names.setdefault(path.name.split(".")[0] if path.is_file() else path.name, path)
    return names


def _namespace_portions(name: str) -> Optional[list[Path]]:
    """The directories of the worker's top-level namespace package ``name``; None when ``name`` is a regular
    module or package (or none at all: then it is not the worker's to merge). Imports nothing."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is not None or not spec.submodule_search_locations:
        return None
    return [Path(portion) for portion in spec.submodule_search_locations]


def _clashes(dotted: str, ours: Path, portions: Optional[list[Path]]) -> list[str]:
    """``dotted`` (ours at ``ours``) against the worker's namespace package of ``portions`` (None: a regular
    one): the names of ours that would hide the worker's."""
    if portions is None or not ours.is_dir() or (ours / "__init__.py").exists():
        return [dotted]  # (a regular package or module of ours in the worker's place: it hides the worker's)
    clashes: list[str] = []
    for name, path in _modules(ours).items():
        theirs = [portion / name for portion in portions if (portion / name).is_dir()]
        regular = any(list(portion.glob(f"{name}.*")) for portion in portions) or any(
            (directory / "__init__.py").exists() for directory in theirs)
        if regular:
            clashes.append(f"{dotted}.{name}")
        elif theirs:
            clashes += _clashes(f"{dotted}.{name}", path, theirs)
    return clashes


def _pip(args: list[str], what: str) -> None:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PackagesUnreachable(f"pip {what} of the job's packages took over {PIP_TIMEOUT_S:.0f}s (is a package "
                                  "index reachable from this worker?)") from None
    if done.returncode == 0:
        return
    output = done.stdout + done.stderr
    tail = "\n".join(output.strip().splitlines()[-OUTPUT_LINES:])
    if any(word in output for word in UNREACHABLE):
        raise PackagesUnreachable(f"pip could not reach a package index from this worker to {what} the job's "
                                  f"packages (exit {done.returncode}):\n{tail}")
    raise PackagesFailed(f"pip could not {what} the job's packages (exit {done.returncode}):\n{tail}")
