"""The shape of the code: one ``baton`` namespace, rooms of at most 25 modules, each saying what it
holds, dependencies pointing one way, no import cycle at module level, and an install that ships
every package."""
from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from tests.helpers import REPO

try:
    import tomllib
except ImportError:  # Python 3.10: pytest brings tomli
    import tomli as tomllib

PACKAGE_DIRS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
"""``{"baton.jobs": "jobs", ...}``: where each top-level piece of the namespace lives in the repository."""
MAX_MODULES = 25
STORAGE = ("baton.storage", "baton.storage.stores", "baton.storage.checkpointing", "baton.storage.memory",
           "baton.storage.records")
WORKERS = ("baton.workers", "baton.workers.training", "baton.workers.parallel", "baton.workers.tracking",
           "baton.workers.attempt", "baton.workers.queue")

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
    "baton.workers.queue": {"baton.workers.training", "baton.workers.parallel", "baton.workers.tracking",
                            "baton.workers.attempt", "baton.schemas", *STORAGE},
    "baton.jobs": {"baton.schemas", *STORAGE},
    "baton": {"baton.jobs", "baton.schemas", *STORAGE, *WORKERS},
}
"""What each room may import (itself always), module level or inside a function: the user's side
(``baton.jobs``) and the workers meet only in the rooms below both, and the command line (``baton``)
sees everything."""


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


def test_every_package_is_installed_and_every_installed_package_exists():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {name for name, path in modules().items() if path.name == "__init__.py"}
    assert listed == on_disk, f"pyproject.toml's packages differ from the tree: missing {on_disk - listed}, " \
                              f"stale {listed - on_disk}"


def test_the_image_copies_every_folder_of_the_namespace():
    dockerfile = (REPO / "Dockerfile").read_text()
    for folder in PACKAGE_DIRS.values():
        assert re.search(rf"^COPY {folder} \./{folder}$", dockerfile, re.M), f"Dockerfile does not COPY {folder}/"


def test_no_folder_holds_more_than_25_modules_and_each_says_what_it_holds():
    by_folder = defaultdict(list)
    for name, path in modules().items():
        by_folder[path.parent].append(name)
    for folder, names in by_folder.items():
        assert len(names) <= MAX_MODULES, f"{folder.relative_to(REPO)} holds {len(names)} modules: split it into rooms"
        init = folder / "__init__.py"
        assert init.exists() and ast.get_docstring(ast.parse(init.read_text())), \
            f"{folder.relative_to(REPO)}/__init__.py must say what the package holds and what it may import"


def test_no_import_cycle_at_module_level():
    top, _ = graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(top[name]):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target]
                raise AssertionError("import cycle at module level: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[name] = 2

    for name in sorted(top):
        if name not in state:
            visit(name)


def test_dependencies_point_one_way_between_rooms():
    top, lazy = graph()
    wrong = []
    for name in top:
        room = room_of(name)
        for target in top[name] | lazy[name]:
            if room_of(target) in ROOMS[room] | {room}:
                continue
            wrong.append(f"{name} -> {target} ({'module level' if target in top[name] else 'in a function'})")
    assert not wrong, "imports against the rooms' direction:\n" + "\n".join(sorted(wrong))


def test_no_cycle_between_rooms_counting_imports_inside_functions():
    top, lazy = graph()
    edges: dict[str, set[str]] = defaultdict(set)
    for name in top:
        for target in top[name] | lazy[name]:
            if room_of(target) != room_of(name):
                edges[room_of(name)].add(room_of(target))
    state: dict[str, int] = {}

    def visit(room: str, path: list[str]) -> None:
        state[room] = 1
        for target in sorted(edges[room]):
            if state.get(target) == 1:
                raise AssertionError("rooms import each other: " + " -> ".join(path[path.index(target):] + [target]))
            if target not in state:
                visit(target, path + [target])
        state[room] = 2

    for room in sorted(ROOMS):
        if room not in state:
            visit(room, [room])


USERS_OWN = {REPO / "tests" / "test_namespace.py"}
"""It imports a user's own packages of those names, on purpose."""
BARE = re.compile(r"""(^|[\s"';])(from|import)\s+(jobs|schemas|storage|workers)(\.|\s|$)|-m\s+(jobs|workers|storage)\b|"""
                  r"""-A\s+workers\b|"-m",\s*"(jobs|workers|storage)\b""", re.M)


def test_nothing_imports_batons_folders_by_their_bare_names():
    """Also inside strings (code run by ``python -c``) and commands: from this repository's root a bare
    ``import jobs`` would still find the folder, so only reading the text catches it."""
    offenders = []
    for folder in ["baton", "schemas", "storage", "workers", "jobs", "tests", "bench", "examples", "scripts",
                   "deploy", "docs"]:
        for path in (REPO / folder).rglob("*"):
            if path.suffix not in (".py", ".sh", ".yml", ".yaml", ".md") or "__pycache__" in path.parts:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if BARE.search(line) and path not in USERS_OWN:
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "bare imports of baton's folders (use baton.<folder>):\n" + "\n".join(offenders)
