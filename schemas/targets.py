"""Parsing ``target`` strings and deciding whether a module may be imported. Pure functions."""
from __future__ import annotations

import re
from typing import NamedTuple

_MODULE = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_TARGET_RE = re.compile(rf"^(?P<module>{_MODULE}):(?P<attr>[A-Za-z_][A-Za-z0-9_]*)$")


class Target(NamedTuple):
    module: str  # "builtin" for built-ins
    attr: str

    @property
    def is_builtin(self) -> bool:
        return self.module == "builtin"


def parse_target(text: str) -> Target:
    """``builtin:NAME`` or ``package.module:callable``; ValueError otherwise."""
    match = _TARGET_RE.fullmatch(text)  # not .match: its "$" also matches before a trailing newline
    if not match:
        raise ValueError(
            f"must be 'builtin:NAME' or 'package.module:callable' (got {text!r})"
        )
    return Target(match["module"], match["attr"])


def module_allowed(module: str, allowed_prefixes: tuple[str, ...]) -> bool:
    """True when ``module`` equals an allowed prefix or lies under it (``a.b`` allows ``a.b.c``, not ``a.bc``)."""
    return any(module == p or module.startswith(p + ".") for p in allowed_prefixes)


def disallowed_message(module: str) -> str:
    return (
        f"module {module!r} is not allowed; add its package to BATON_ALLOWED_MODULES "
        f"(comma-separated prefixes, e.g. BATON_ALLOWED_MODULES={module.split('.')[0]}) "
        "on the submitting machine (the pool's server, for its users: ask its operator) and on every worker"
    )


def disallowed_targets(targets: dict[str, str], allowed_prefixes: tuple[str, ...]) -> list[str]:
    """Problems for every non-builtin target (``{"model.target": "pkg.mod:fn", ...}``) outside the allowlist."""
    problems = []
    for field, text in targets.items():
        target = parse_target(text)
        if not target.is_builtin and not module_allowed(target.module, allowed_prefixes):
            problems.append(f"{field}: {disallowed_message(target.module)}")
    return problems
