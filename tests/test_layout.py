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

ROOMS = {
    "baton.schemas": set(),
    "baton.storage": {"baton.schemas"},
    "baton.workers.training": {"baton.schemas", "baton.storage"},
    "baton.workers.parallel": {"baton.workers.training", "baton.schemas", "baton.storage", "baton.jobs.redaction"},
    "baton.workers.tracking": {"baton.workers.training", "baton.schemas", "baton.storage", "baton.jobs.logs",
                               "baton.jobs.redaction"},
    "baton.workers.attempt": {"baton.workers.training", "baton.workers.parallel", "baton.workers.tracking",
                              "baton.schemas", "baton.storage", "baton.jobs.logs", "baton.jobs.redaction",
                              "baton.jobs.display"},
    "baton.workers.queue": {"baton.workers.training", "baton.workers.parallel", "baton.workers.tracking",
                            "baton.workers.attempt", "baton.schemas", "baton.storage", "baton.jobs"},
    "baton.jobs": {"baton.schemas", "baton.storage"},
    "baton": {"baton.jobs", "baton.schemas", "baton.workers.training.task_api"},
}
"""What each room may import (itself always). The queue side reads job records through ``baton.jobs``."""

ENTRY_POINTS = {
    ("baton.jobs.cli", "baton.workers.attempt.local"): "`baton run`, imported when the command runs",
    ("baton.jobs.cli", "baton.workers.queue.worker_main"): "`baton worker`, imported when the command runs",
    ("baton.jobs.client", "baton.workers.queue.celery_app"): "publishing a job: the Celery app, not the loop",
}
"""The only imports from ``baton.jobs`` into the workers' rooms, each inside the function that needs it."""


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
            allowed = ROOMS[room] | {room}
            if any(target == a or target.startswith(a + ".") for a in allowed) or (name, target) in ENTRY_POINTS:
                continue
            wrong.append(f"{name} -> {target} ({'module level' if target in top[name] else 'in a function'})")
    assert not wrong, "imports against the rooms' direction:\n" + "\n".join(sorted(wrong))


def test_entry_points_from_jobs_into_the_workers_are_imported_lazily():
    top, lazy = graph()
    for (name, target), why in ENTRY_POINTS.items():
        assert target not in top[name], f"{name} imports {target} at module level ({why})"


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
