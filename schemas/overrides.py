"""``--set a.b=v`` overrides and ``--grid a.b=v1,v2`` sweeps: parsing and applying them to a raw spec.

Pure: no I/O. An override is applied to the spec's raw mapping (what the YAML file holds), and the
result is validated as any spec is (``JobSpec.parse``), so a misspelled path or a wrong value is
reported exactly as it would be in the file: ``optimizer.lrr: unknown field``.

Values are YAML scalars or flow collections (``1e-3``, ``true``, ``null``, ``adamw``, ``[64, 64]``,
``{hidden: 64}``). Unlike PyYAML's YAML 1.1, ``1e-3`` is a number here (YAML 1.2), as anyone typing
a learning rate on a command line means it.
"""
from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

import yaml

from baton.schemas.errors import SpecError

Overrides = Optional[Union[Mapping[str, Any], Sequence[str]]]
"""``{"optimizer.lr": 1e-3}`` or ``["optimizer.lr=1e-3"]``."""

_PATH_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")


class _ValueLoader(yaml.SafeLoader):
    """SafeLoader that also reads YAML 1.2 floats without a dot (``1e-3``, ``5E4``)."""


_ValueLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_value(text: str, where: str) -> Any:
    """``text`` as a YAML scalar or flow collection; SpecError naming ``where`` if it is not one."""
    try:
        return yaml.load(text, Loader=_ValueLoader) if text.strip() else ""
    except yaml.YAMLError as exc:
        reason = str(exc).splitlines()[0]
        raise SpecError([f"{where}: {text!r} is not a YAML value ({reason})"]) from None


def _split(text: str, option: str) -> tuple[str, str]:
    path, sep, value = text.partition("=")
    path = path.strip()
    if not sep or not _PATH_RE.match(path):
        raise SpecError([f"{option} {text}: expected dotted.path=value (e.g. optimizer.lr=1e-3)"])
    return path, value


def parse_assignment(text: str) -> tuple[str, Any]:
    """``"optimizer.lr=1e-3"`` -> ``("optimizer.lr", 0.001)``."""
    path, value = _split(text, "--set")
    return path, parse_value(value, path)


def parse_axis(text: str) -> tuple[str, list[Any]]:
    """``"optimizer.lr=1e-3,3e-3"`` -> ``("optimizer.lr", [0.001, 0.003])``. The values are a YAML
    flow sequence without its brackets, so a value may itself be a list: ``hidden=[64,64],[128,128]``."""
    path, values = _split(text, "--grid")
    parsed = parse_value(f"[{values}]", path)
    if not parsed:
        raise SpecError([f"{path}: --grid needs at least one value"])
    return path, parsed


def normalize(overrides: Overrides) -> dict[str, Any]:
    """Overrides as ``{dotted.path: value}``, from a mapping or from ``"a.b=v"`` strings."""
    if not overrides:
        return {}
    if isinstance(overrides, Mapping):
        bad = [p for p in overrides if not isinstance(p, str) or not _PATH_RE.match(p)]
        if bad:
            raise SpecError([f"overrides: {p!r} is not a dotted path (e.g. optimizer.lr)" for p in bad])
        return dict(overrides)
    return dict(parse_assignment(text) for text in overrides)


def normalize_grid(grid: "Mapping[str, Sequence[Any]] | Sequence[str]") -> dict[str, list[Any]]:
    """A grid as ``{dotted.path: [values]}``, from a mapping or from ``"a.b=v1,v2"`` strings."""
    if isinstance(grid, Mapping):
        axes = {}
        for path, values in grid.items():
            if not isinstance(path, str) or not _PATH_RE.match(path):
                raise SpecError([f"grid: {path!r} is not a dotted path (e.g. optimizer.lr)"])
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
                raise SpecError([f"{path}: a grid axis needs a non-empty list of values"])
            axes[path] = list(values)
    else:
        axes = dict(parse_axis(text) for text in grid)
    if not axes:
        raise SpecError(["grid: give at least one axis (--grid dotted.path=v1,v2)"])
    return axes


def apply_overrides(raw: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``raw`` with each dotted path set; missing sections are created (validation then
    says whether they may exist). A path through a value that is not a mapping is a SpecError."""
    result = copy.deepcopy(dict(raw))
    problems = []
    for path, value in overrides.items():
        node: Any = result
        parts = path.split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                problems.append(f"{path}: {'.'.join(parts[:depth + 1])} is {type(child).__name__} {child!r}, "
                                "not a mapping")
                break
            node = child
        else:
            node[parts[-1]] = copy.deepcopy(value)
    if problems:
        raise SpecError(problems)
    return result


def grid_points(axes: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the axes' values (the first axis varies slowest), as overrides."""
    paths = list(axes)
    return [dict(zip(paths, combo)) for combo in itertools.product(*(axes[p] for p in paths))]
