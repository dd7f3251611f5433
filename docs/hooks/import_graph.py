"""The rooms of baton's code and the imports between them, read from the source (``ast``, nothing
imported): what ``tests/test_layout.py`` checks and what ``docs/architecture.md`` shows (``reference.py``
generates its table from here).

``ROOMS`` is the rule: what each room may import, at module level or inside a function."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIRS: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
"""``{"baton.jobs": "jobs", ...}``: where each top-level piece of the namespace lives in the repository."""
STORAGE = ("baton.storage", "baton.storage.stores", "baton.storage.checkpointing", "baton.storage.memory",
           "baton.storage.records")
WORKERS = ("baton.workers", "baton.workers.training", "baton.workers.parallel", "baton.workers.tracking",
           "baton.workers.attempt", "baton.workers.code", "baton.workers.queue")

ROOMS = {
    "baton.schemas": set(),
    "baton.storage.stores": {"baton.schemas"},
    "baton.storage": {"baton.schemas", "baton.storage.stores"},
    "baton.storage.checkpointing": {"baton.schemas", "baton.storage", "baton.storage.stores"},
    "baton.storage.memory": {"baton.schemas", "baton.storage", "baton.storage.checkpointing"},
    "baton.storage.records": {"baton.schemas", "baton.storage", "baton.storage.stores"},
    "baton.workers.training": {"baton.schemas", *STORAGE},
    "baton.workers.parallel": {"baton.workers.training", "baton.schemas", *STORAGE},
    "baton.workers.tracking": {"baton.workers.training", "baton.schemas", *STORAGE},
    "baton.workers.attempt": {"baton.workers.training", "baton.workers.parallel", "baton.workers.tracking",
                              "baton.schemas", *STORAGE},
    "baton.searches": {"baton.schemas", *STORAGE},
    "baton.workers.code": {"baton.schemas", *STORAGE},
    "baton.workers.queue": {"baton.workers.training", "baton.workers.parallel", "baton.workers.tracking",
                            "baton.workers.attempt", "baton.workers.code", "baton.searches", "baton.schemas",
                            *STORAGE},
    "baton.jobs": {"baton.searches", "baton.schemas", *STORAGE},
    "baton.dashboard": {"baton.jobs", "baton.schemas", *STORAGE},
    "baton": {"baton.jobs", "baton.dashboard", "baton.searches", "baton.schemas", *STORAGE, *WORKERS},
}
"""What each room may import (itself always), module level or inside a function: the user's side
(``baton.jobs``) and the workers meet only in the rooms below both, and the command line (``baton``)
sees everything. A search (``baton.searches``) is decided from either side: by the client that submits it
and by the worker whose trial pauses."""


def modules() -> dict[str, Path]:
    """Every module of the installed namespace, by its dotted name, from the package-dir mapping."""
    found = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(module-level imports, imports inside functions) of baton's own modules."""
    is_package = path.name == "__init__.py"
    top, lazy = set(), set()

    def resolve(node: ast.ImportFrom) -> list[str]:
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        return [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]

    def visit(nodes: list, at_top: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.ImportFrom):
                targets = resolve(node)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                targets = []
            for target in targets:
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in known and target != name:
                    (top if at_top else lazy).add(target)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue  # for type checkers only: never imported at run time
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(node.body, False)
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    if isinstance(getattr(node, field, None), list):
                        visit(getattr(node, field), at_top)

    visit(ast.parse(path.read_text()).body, True)
    return top, lazy


def room_of(name: str) -> str:
    return max((room for room in ROOMS if name == room or name.startswith(room + ".")), key=len)


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    found = modules()
    known = set(found)
    top, lazy = {}, {}
    for name, path in found.items():
        top[name], lazy[name] = imports(name, path, known)
    return top, lazy


def room_graph() -> dict[str, set[str]]:
    """Each room's imports of other rooms (module level and inside functions)."""
    top, lazy = graph()
    edges: dict[str, set[str]] = defaultdict(set)
    for name in top:
        for target in top[name] | lazy[name]:
            if room_of(target) != room_of(name):
                edges[room_of(name)].add(room_of(target))
    return edges
