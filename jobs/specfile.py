"""Reading a job spec from a YAML/JSON file, a mapping or a JobSpec, and checking its targets."""
from __future__ import annotations

import difflib
import importlib
import importlib.util
import json
from pathlib import Path
from typing import Any, Union

import yaml

from baton.schemas.errors import SpecError
from baton.schemas.overrides import Overrides, apply_overrides, normalize
from baton.schemas.spec import JobSpec
from baton.schemas.targets import disallowed_targets, parse_target

SpecSource = Union[str, Path, dict, JobSpec]


def _read_file(path: Path) -> Any:
    if not path.is_file():
        raise SpecError([f"spec: no such file: {path}"])
    text = path.read_text()
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecError([f"spec: {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}"]) from None


def read_raw(source: SpecSource) -> Any:
    """The spec as a raw mapping (what its file holds), before validation."""
    if isinstance(source, (str, Path)):
        return _read_file(Path(source))
    if isinstance(source, JobSpec):
        return source.model_dump()
    return source


def load_spec(source: SpecSource, allowed_prefixes: tuple[str, ...] = (), overrides: Overrides = None) -> JobSpec:
    """A validated JobSpec whose targets are all allowed under ``allowed_prefixes`` and, where their
    module is importable on this machine, exist. ``overrides`` (``{"optimizer.lr": 1e-3}`` or
    ``["optimizer.lr=1e-3"]``) are applied to the raw mapping first, then everything is validated."""
    return check_spec(with_overrides(read_raw(source), normalize(overrides)), allowed_prefixes)


def with_overrides(raw: Any, overrides: dict[str, Any]) -> Any:
    if not overrides:
        return raw
    if not isinstance(raw, dict):
        raise SpecError([f"spec: must be a mapping (got {type(raw).__name__})"])
    return apply_overrides(raw, overrides)


def check_spec(raw: Any, allowed_prefixes: tuple[str, ...] = ()) -> JobSpec:
    """Validate a raw mapping (or a JobSpec) and check its targets as ``load_spec`` does."""
    spec = JobSpec.parse(raw)
    problems = disallowed_targets(spec.user_targets(), allowed_prefixes)
    if problems:
        raise SpecError(problems)
    problems = [problem for _, problem in check_user_targets(spec) if problem is not None]
    if problems:
        raise SpecError(problems)
    return spec


def check_user_targets(spec: JobSpec) -> list[tuple[str, "str | None"]]:
    """For each user target: (a note, None) when it is checked or cannot be checked here, or
    (field, problem) when its module imports here but has no such callable (a misspelling)."""
    results = []
    for field, text in spec.user_targets().items():
        target = parse_target(text)
        if target.is_builtin:
            continue
        try:
            found = importlib.util.find_spec(target.module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            results.append((f"{field}: module {target.module!r} is not importable here; it is checked on the worker", None))
            continue
        module = importlib.import_module(target.module)
        if callable(getattr(module, target.attr, None)):
            results.append((f"{field}: {text} found", None))
            continue
        names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        close = difflib.get_close_matches(target.attr, names, n=3)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        results.append((field, f"{field}: module {target.module!r} has no callable {target.attr!r}{hint}"))
    return results
