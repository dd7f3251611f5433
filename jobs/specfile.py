"""Reading a job spec from a YAML/JSON file, a mapping or a JobSpec, and checking its targets."""
from __future__ import annotations

import difflib
import inspect
import json
from pathlib import Path
from typing import Any, Union

import yaml

from baton.schemas.errors import SpecError
from baton.schemas.overrides import Overrides, apply_overrides, normalize
from baton.schemas.builtins import BUILTIN_DATA, BUILTIN_MODELS, BUILTIN_TASKS
from baton.schemas.problems import Problems
from baton.schemas.spec import JobSpec, check_target
from baton.schemas.targets import disallowed_targets, parse_target

from baton.jobs.code_ship import code_dir, importable
from baton.jobs.source_lookup import find_module, lookup, module_source

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


def load_spec(source: SpecSource, allowed_prefixes: tuple[str, ...] = (), overrides: Overrides = None,
              code: "str | Path | None" = None) -> JobSpec:
    """A validated JobSpec whose targets are all allowed under ``allowed_prefixes`` and, where their
    module is importable on this machine (from ``code.dir`` first, when the spec ships one), exist.
    ``overrides`` (``{"optimizer.lr": 1e-3}`` or ``["optimizer.lr=1e-3"]``) are applied to the raw
    mapping first, then ``code`` (as ``code.dir``), then everything is validated."""
    wanted = {**normalize(overrides), **({"code.dir": str(code)} if code is not None else {})}
    raw = with_overrides(read_raw(source), wanted)
    with importable(code_dir(raw)):
        return check_spec(raw, allowed_prefixes)


def with_overrides(raw: Any, overrides: dict[str, Any]) -> Any:
    if not overrides:
        return raw
    if not isinstance(raw, dict):
        raise SpecError([f"spec: must be a mapping (got {type(raw).__name__})"])
    return apply_overrides(raw, overrides)


def check_spec(raw: Any, allowed_prefixes: tuple[str, ...] = ()) -> JobSpec:
    """Validate a raw mapping (or a JobSpec) and check its targets as ``load_spec`` does. A spec that
    does not validate still has its well-formed targets checked: every wrong field is said at once."""
    try:
        spec = JobSpec.parse(raw)
    except SpecError as exc:
        more = _raw_target_problems(raw, allowed_prefixes, exc.problems)
        if more:
            raise SpecError([*exc.problems, *more]) from None
        raise
    problems = disallowed_targets(spec.user_targets(), allowed_prefixes)
    if problems:
        raise SpecError(problems)
    problems = [problem for _, problem in check_user_targets(spec) if problem is not None]
    if problems:
        raise SpecError(problems)
    return spec


TARGET_FIELDS = ("model", "data", "task", "data.val", "data.collate")
"""Where a spec names targets (``JobSpec.user_targets``)."""
BUILTIN_REGISTRIES = {"model": BUILTIN_MODELS, "data": BUILTIN_DATA, "task": BUILTIN_TASKS, "data.val": BUILTIN_DATA,
                      "data.collate": {}}
"""The built-ins each target field may name."""


def _raw_target_problems(raw: Any, allowed_prefixes: tuple[str, ...], known: list[str]) -> list[str]:
    """The problems of the well-formed targets of a spec that did not validate (fields already
    named in ``known`` left out)."""
    if not isinstance(raw, dict):
        return []
    targets: dict[str, tuple[str, dict]] = {}
    builtin_problems: list[str] = []
    for path in TARGET_FIELDS:
        part: Any = raw
        for name in path.split("."):
            part = part.get(name) if isinstance(part, dict) else None
        field = f"{path}.target"
        if not isinstance(part, dict) or not isinstance(part.get("target"), str) or \
                any(problem.startswith((field, f"{path}.kwargs")) for problem in known):
            continue
        try:
            parsed = parse_target(part["target"])
        except ValueError as exc:
            builtin_problems += [f"{field}: {exc}"] if f"{field}: {exc}" not in known else []
            continue
        kwargs = part.get("kwargs")
        kwargs = kwargs if isinstance(kwargs, dict) else {}
        if parsed.is_builtin:  # (checked by its section's own rules, which a wrong field beside it stops)
            builtin = Problems()
            check_target(builtin, part["target"], kwargs, BUILTIN_REGISTRIES[path])
            builtin_problems += [f"{path}.{line}" for line in builtin.lines if f"{path}.{line}" not in known]
            continue
        targets[field] = (part["target"], kwargs)
    problems = disallowed_targets({field: text for field, (text, _) in targets.items()}, allowed_prefixes)
    if problems:
        return builtin_problems + problems
    return builtin_problems + [problem for _, problem in _check_targets(targets) if problem is not None]


def check_user_targets(spec: JobSpec) -> list[tuple[str, "str | None"]]:
    """For each user target: (a note, None) when it is checked or cannot be checked here, or
    (field, problem) when it would fail at job start: its module is missing from a package that
    imports here, the module has no such callable (a misspelling), or the callable does not take
    the spec's kwargs."""
    return _check_targets({field: (text, _kwargs_of(spec, field)) for field, text in spec.user_targets().items()})


def _check_targets(targets: dict[str, tuple[str, dict]]) -> list[tuple[str, "str | None"]]:
    """Each target checked from its module's source (``source_lookup``): nothing of the job's code runs,
    nor any package above it. What the source cannot settle is left to the worker, and said so."""
    results: list[tuple[str, "str | None"]] = []
    for field, (text, kwargs) in targets.items():
        target = parse_target(text)
        if target.is_builtin:
            continue
        path = module_source(target.module)
        found = lookup(path, target.attr) if path is not None else None
        if found is not None and found.defined is False:
            results.append((field, _no_callable(field, target.module, target.attr, found.names)))
        elif found is not None and found.defined:
            problem = None if found.params is None else params_problem(field, text, found.params, kwargs)
            results.append((field, problem) if problem else (f"{field}: {text} found", None))
        elif found is not None:
            results.append((f"{field}: module {target.module!r} may define {target.attr!r} only when it runs (a star "
                            "import or a module __getattr__); it is checked on the worker", None))
        else:
            results.append(_unreadable(field, target.module))
    return results


def _unreadable(field: str, module: str) -> tuple[str, "str | None"]:
    """A module whose source cannot be read here: missing from a package that is here (refused), or found
    only by an import hook, compiled, or not here at all (left to the worker)."""
    spec, parts = find_module(module)
    package = ".".join(module.split(".")[:parts])
    if spec is None and parts > 0:
        return field, f"{field}: module {module!r} does not exist (its package {package!r} imports here)"
    if spec is not None:
        return f"{field}: module {module!r} is not a Python source file here; it is checked on the worker", None
    return f"{field}: module {module!r} is not importable here; it is checked on the worker", None


def _no_callable(field: str, module: str, attr: str, names: list[str]) -> str:
    close = difflib.get_close_matches(attr, names, n=3)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return f"{field}: module {module!r} has no callable {attr!r}{hint}"


def _kwargs_of(spec: JobSpec, field: str) -> dict:
    """The kwargs beside a target (``data.collate.target`` -> ``spec.data.collate.kwargs``)."""
    part: Any = spec
    for name in field.split(".")[:-1]:
        part = getattr(part, name)
    return dict(part.kwargs)


CALLED_WITH = {"data.target": ((), ("seed",)), "data.val.target": ((), ("seed",)), "data.collate.target": (("samples",), ())}
"""How each target is called besides its kwargs: (positional arguments, keywords baton adds when the
callable takes them). A collate function gets the samples first; a data set gets the job's seed."""


def kwargs_problem(field: str, text: str, fn: Any, kwargs: dict) -> "str | None":
    """Why ``fn(**kwargs)`` (as baton calls it) would fail on its arguments; None if it would not, or
    if its signature cannot be read."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    return params_problem(field, text, params, kwargs)


def params_problem(field: str, text: str, params: list[inspect.Parameter], kwargs: dict) -> "str | None":
    """Why a callable taking ``params`` would fail on ``kwargs`` as baton calls it; None if it would not."""
    positional, added = CALLED_WITH.get(field, ((), ()))
    kwargs_field = field.rsplit(".", 1)[0] + ".kwargs"
    params = params[len(positional):] if len(params) >= len(positional) else []
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    takes = ", ".join(p.name for p in named) or "no keyword arguments"
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        unknown = [k for k in kwargs if k not in {p.name for p in named}]
        if unknown:
            return f"{kwargs_field}: {text} takes no argument {', '.join(repr(k) for k in unknown)} (it takes: {takes})"
    missing = [p.name for p in named if p.default is p.empty and p.name not in kwargs and p.name not in added]
    if missing:
        return f"{kwargs_field}: {text} needs {', '.join(repr(m) for m in missing)} (it takes: {takes})"
    return None
