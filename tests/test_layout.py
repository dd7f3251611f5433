"""The shape of the code: one ``baton`` namespace, rooms of at most 25 modules, each saying what it
holds, dependencies pointing one way, no import cycle at module level, and an install that ships
every package."""
from __future__ import annotations

import ast
import importlib.util
import re
from collections import defaultdict

from tests.helpers import REPO

MAX_MODULES = 25
MAX_PARAMETERS = 8
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 400

_spec = importlib.util.spec_from_file_location("import_graph", REPO / "docs" / "hooks" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)
PACKAGE_DIRS, ROOMS, modules, graph, room_of = (import_graph.PACKAGE_DIRS, import_graph.ROOMS, import_graph.modules,
                                                import_graph.graph, import_graph.room_of)


def test_every_package_is_installed_and_every_installed_package_exists():
    listed = set(import_graph.tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
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
    edges = import_graph.room_graph()
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


def _functions() -> list[tuple[str, ast.FunctionDef]]:
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((f"{path.relative_to(REPO)}:{node.lineno} {node.name}", node))
    return found


def test_no_function_takes_more_than_8_parameters_or_runs_over_60_lines():
    """Values that travel together have a name (an attempt, its options, a rank's plan): a long parameter
    list is a group nobody named; a long function, steps nobody named."""
    crowded, long = [], []
    for where, node in _functions():
        args = node.args
        named = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls")]
        count = len(named) + (args.vararg is not None) + (args.kwarg is not None)
        if count > MAX_PARAMETERS:
            crowded.append(f"{where}: {count} parameters")
        if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
            long.append(f"{where}: {node.end_lineno - node.lineno + 1} lines")
    assert not crowded + long, "\n".join(crowded + long)


def test_no_module_is_over_400_lines():
    over = [f"{path.relative_to(REPO)}: {len(path.read_text().splitlines())} lines" for path in modules().values()
            if len(path.read_text().splitlines()) > MAX_MODULE_LINES]
    assert not over, "split these by what they hold:\n" + "\n".join(over)


def test_a_single_node_attempt_holds_no_multi_node_branch():
    """One attempt's code is the same on one node or many: a multi-node leader reaches its other nodes
    through the peers its worker gives it (``baton.workers.parallel.nodes``), never a branch here."""
    mentions = [f"{path.relative_to(REPO)}:{number}" for name, path in modules().items()
                if name.startswith("baton.workers.attempt")
                for number, line in enumerate(path.read_text().splitlines(), 1) if "gang" in line.lower()]
    assert not mentions, "workers/attempt mentions gangs:\n" + "\n".join(mentions)


def test_a_workers_main_process_imports_no_library_a_job_alone_needs():
    """A worker's main process claims jobs, renews leases and reads records: its start should not pay for
    torch (~1 s of a core and ~200 MB at every start), nor for the libraries of a job's loop (torchmetrics,
    scipy, matplotlib: ~1 s more) or sharded checkpoints. Its forkserver imports those, once, for the jobs;
    a follower of a multi-node gang imports torch.distributed as it starts its ranks."""
    import subprocess
    import sys

    heavy = ("torch", "numpy", "torchmetrics", "scipy", "matplotlib", "torch.distributed.checkpoint", "torch.distributed.tensor")
    code = ("import sys, baton.workers.queue.tasks, baton.workers.queue.worker_main; "
            f"print(' '.join(m for m in {heavy!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], f"a worker's main process imports {done.stdout.strip()}"
