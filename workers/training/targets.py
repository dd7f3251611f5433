"""Turning a spec's ``target`` into the callable it names, refusing modules outside the allowlist."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from typing import Any, Callable, Mapping, Optional

from torch import nn
from torch.utils.data import Dataset, IterableDataset

from baton.schemas.errors import PermanentError
from baton.schemas.spec import DataSpec, ModelSpec, TargetSpec, TaskSpec
from baton.schemas.targets import disallowed_message, module_allowed, parse_target

from baton.workers.training import builtins, rng
from baton.workers.training.task_api import BoundTask


def resolve(target: str, builtin_registry: Mapping[str, Callable], allowed_prefixes: tuple[str, ...]) -> Callable:
    parsed = parse_target(target)
    if parsed.is_builtin:
        return builtin_registry[parsed.attr]
    if not module_allowed(parsed.module, allowed_prefixes):
        raise PermanentError(f"{target}: {disallowed_message(parsed.module)}")
    try:
        with rng.kept_through_imports():
            module = importlib.import_module(parsed.module)
    except ModuleNotFoundError as exc:
        if hasattr(exc, "add_note") and exc.name is not None and parsed.module.startswith(exc.name):
            exc.add_note(f"while importing {target}: baton imports your code from the directory it runs in and "
                         "from installed packages; run it from your project's directory, `pip install -e` your "
                         "project, or set PYTHONPATH (on every worker too)")
        raise
    fn = getattr(module, parsed.attr, None)
    if not callable(fn):
        raise PermanentError(f"{target}: module {parsed.module!r} has no callable {parsed.attr!r}")
    return fn


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


def _accepts(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def build_model(spec: ModelSpec, allowed_prefixes: tuple[str, ...]) -> nn.Module:
    model = resolve(spec.target, builtins.MODELS, allowed_prefixes)(**spec.kwargs)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model target {spec.target} returned {type(model).__name__}, not an nn.Module")
    return model


def build_dataset(spec: "TargetSpec | DataSpec", seed: int, allowed_prefixes: tuple[str, ...]) -> Dataset:
    """A map-style Dataset or an IterableDataset (``spec`` is data or data.val: target and kwargs)."""
    fn = resolve(spec.target, builtins.DATA, allowed_prefixes)
    kwargs: dict[str, Any] = dict(spec.kwargs)
    if _accepts(fn, "seed"):
        kwargs["seed"] = seed
    dataset = fn(**kwargs)
    iterable = isinstance(dataset, IterableDataset)
    if not iterable and (not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__")):
        raise TypeError(f"data target {spec.target} returned {type(dataset).__name__}, neither a map-style Dataset "
                        "(__getitem__ and __len__) nor an IterableDataset")
    return dataset


def build_task(spec: TaskSpec, allowed_prefixes: tuple[str, ...]) -> BoundTask:
    return BoundTask(resolve(spec.target, builtins.TASKS, allowed_prefixes)(**spec.kwargs), spec.target)


def build_collate(spec: Optional[TargetSpec], allowed_prefixes: tuple[str, ...]) -> Optional[Callable]:
    """The collate function, with its kwargs bound (a partial of a module-level function pickles
    into loader worker processes)."""
    if spec is None:
        return None
    fn = resolve(spec.target, {}, allowed_prefixes)
    return functools.partial(fn, **spec.kwargs) if spec.kwargs else fn
