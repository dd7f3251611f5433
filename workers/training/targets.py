"""Turning a spec's ``target`` into the callable it names, refusing modules outside the allowlist."""
from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Callable, Mapping, Optional

from torch import nn
from torch.utils.data import Dataset, IterableDataset

from baton.schemas.errors import PermanentError
from baton.schemas.spec import DataSpec, ModelSpec, TargetSpec, TaskSpec
from baton.schemas.targets import disallowed_message, module_allowed, parse_target

from baton.workers.training import rng
from baton.workers.training.task_api import BoundTask


def _builtins():
    """baton's built-in models, data sets and tasks: imported when a spec is built, not by whoever only asks
    whether its targets may be imported (a worker's main process: torchmetrics alone is ~1 s of a core)."""
    from baton.workers.training import builtins

    return builtins


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


def _accepts(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def build_model(spec: ModelSpec, allowed_prefixes: tuple[str, ...]) -> nn.Module:
    model = resolve(spec.target, _builtins().MODELS, allowed_prefixes)(**spec.kwargs)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model target {spec.target} returned {type(model).__name__}, not an nn.Module")
    return model


def build_dataset(spec: "TargetSpec | DataSpec", seed: int, allowed_prefixes: tuple[str, ...]) -> Dataset:
    """A map-style Dataset or an IterableDataset (``spec`` is data or data.val: target and kwargs)."""
    fn = resolve(spec.target, _builtins().DATA, allowed_prefixes)
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
    return BoundTask(resolve(spec.target, _builtins().TASKS, allowed_prefixes)(**spec.kwargs), spec.target)


def build_collate(spec: Optional[TargetSpec], allowed_prefixes: tuple[str, ...]) -> Optional[Callable]:
    """The collate function, with its kwargs bound (a partial of a module-level function pickles
    into loader worker processes)."""
    if spec is None:
        return None
    fn = resolve(spec.target, {}, allowed_prefixes)
    return functools.partial(fn, **spec.kwargs) if spec.kwargs else fn
