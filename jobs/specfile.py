"""Reading a job spec from a YAML/JSON file, a mapping or a JobSpec, and checking its targets."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Union

import yaml

from schemas.errors import SpecError
from schemas.spec import JobSpec
from schemas.targets import disallowed_targets

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


def load_spec(source: SpecSource, allowed_prefixes: tuple[str, ...] = ()) -> JobSpec:
    """A validated JobSpec whose targets are all importable under ``allowed_prefixes``."""
    raw = _read_file(Path(source)) if isinstance(source, (str, Path)) else source
    spec = JobSpec.parse(raw)
    problems = disallowed_targets({"model.target": spec.model.target, "data.target": spec.data.target}, allowed_prefixes)
    if problems:
        raise SpecError(problems)
    return spec
