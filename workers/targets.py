"""Turning a spec's ``target`` into the callable it names, refusing modules outside the allowlist."""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

from torch import nn
from torch.utils.data import Dataset

from schemas.errors import PermanentError
from schemas.spec import DataSpec, ModelSpec
from schemas.targets import disallowed_message, module_allowed, parse_target

from . import builtins


def resolve(target: str, builtin_registry: dict[str, Callable], allowed_prefixes: tuple[str, ...]) -> Callable:
    parsed = parse_target(target)
    if parsed.is_builtin:
        return builtin_registry[parsed.attr]
    if not module_allowed(parsed.module, allowed_prefixes):
        raise PermanentError(f"{target}: {disallowed_message(parsed.module)}")
    module = importlib.import_module(parsed.module)
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
    model = resolve(spec.target, builtins.MODELS, allowed_prefixes)(**spec.kwargs)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model target {spec.target} returned {type(model).__name__}, not an nn.Module")
    return model


def build_dataset(spec: DataSpec, seed: int, allowed_prefixes: tuple[str, ...]) -> Dataset:
    fn = resolve(spec.target, builtins.DATA, allowed_prefixes)
    kwargs: dict[str, Any] = dict(spec.kwargs)
    if _accepts(fn, "seed"):
        kwargs["seed"] = seed
    dataset = fn(**kwargs)
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise TypeError(f"data target {spec.target} returned {type(dataset).__name__}, not a map-style Dataset")
    return dataset
