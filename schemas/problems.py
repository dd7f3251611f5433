"""Turns Pydantic's validation errors into one ``dotted.path: message`` line per wrong field."""
from __future__ import annotations

import difflib
import typing
from typing import Any, Optional

from pydantic import BaseModel, ValidationError

# Validators that check several fields at once raise ValueError whose text is one
# "relative.path: message" line per problem; PROBLEM_SEP joins them.
PROBLEM_SEP = "\n"


def _path(loc: tuple) -> str:
    return ".".join(str(part) for part in loc)


def _join(prefix: str, suffix: str) -> str:
    return f"{prefix}.{suffix}" if prefix and suffix else prefix or suffix


def _message(err: dict) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "greater_than":
        return f"must be > {ctx['gt']}"
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']}"
    if kind == "less_than":
        return f"must be < {ctx['lt']}"
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']}"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']} (got {err.get('input')!r})"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be an integer (got {err.get('input')!r})"
    if kind in ("float_type", "float_parsing"):
        return f"must be a number (got {err.get('input')!r})"
    if kind in ("bool_type", "bool_parsing"):
        return f"must be true or false (got {err.get('input')!r})"
    if kind in ("string_type",):
        return f"must be a string (got {err.get('input')!r})"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"must be a mapping (got {type(err.get('input')).__name__})"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx['pattern']} (got {err.get('input')!r})"
    if kind == "too_short":
        return f"must have at least {ctx['min_length']} item{'s' if ctx['min_length'] != 1 else ''}"
    if kind == "finite_number":
        return "must be a finite number"
    return err["msg"]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The Pydantic models an annotation may hold (``Optional[X]``, ``X | Y``, ``X``)."""
    candidates = typing.get_args(annotation) or (annotation,)
    return [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]


def _model_at(model: type[BaseModel], loc: tuple) -> Optional[type[BaseModel]]:
    """The model that holds the field at ``loc`` (None where the path leaves the models)."""
    for part in loc:
        field = model.model_fields.get(str(part))
        inner = _models_in(field.annotation) if field is not None else []
        if len(inner) != 1:
            return None
        model = inner[0]
    return model


def suggestion(model: Optional[type[BaseModel]], loc: tuple) -> str:
    """`` (did you mean `x`?)`` for an unknown field at ``loc``: its closest sibling, or a section's
    field of that very name (``epochs`` at the top is ``loop.epochs``); empty when nothing is close."""
    parent = _model_at(model, loc[:-1]) if model is not None and loc else None
    if parent is None:
        return ""
    name = str(loc[-1])
    close = difflib.get_close_matches(name, list(parent.model_fields), n=1, cutoff=0.7)
    if close:
        return f" (did you mean `{close[0]}`?)"
    for section, field in parent.model_fields.items():
        if any(name in inner.model_fields for inner in _models_in(field.annotation)):
            return f" (did you mean `{section}.{name}`?)"
    return ""


def problems_from(error: ValidationError, prefix: str = "", model: Optional[type[BaseModel]] = None) -> list[str]:
    """One line per problem, each naming the field's dotted path from the spec's root; an unknown
    field of ``model`` (the model validated) gets the field it was likely meant to be."""
    lines: list[str] = []
    for err in error.errors(include_url=False):
        where = _join(prefix, _path(err["loc"]))
        if err["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown field{suggestion(model, err['loc'])}")
            continue
        if err["type"] == "value_error":
            text = str(err["ctx"]["error"]) if "error" in err.get("ctx", {}) else err["msg"]
            for line in text.split(PROBLEM_SEP):
                field, sep, msg = line.partition(": ")
                lines.append(f"{_join(where, field)}: {msg}" if sep else f"{where or 'spec'}: {line}")
        else:
            lines.append(f"{where or 'spec'}: {_message(dict(err))}")
    return lines


class Problems:
    """Collects cross-field problems in a validator, then raises them together."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, field: str, message: str) -> None:
        self.lines.append(f"{field}: {message}")

    def raise_if_any(self) -> None:
        if self.lines:
            raise ValueError(PROBLEM_SEP.join(self.lines))
