"""Finding a callable in a module's source without importing the module.

Validating a spec must not run the job's code: importing a model's module can take tens of seconds
(``transformers``) and do anything. The module's file is found the way ``import`` would find it on
``sys.path`` (``PathFinder``, which executes no package's ``__init__``), read and parsed with ``ast``;
its top-level definitions answer whether the callable exists and, for a plain ``def`` or a class with
its own ``__init__`` defined once and unconditionally, which arguments it takes.

What the source cannot settle (a module found only by an import hook, a compiled module, a name made
by ``from x import *`` or a module ``__getattr__``, a decorated function) is left to the worker.
"""
from __future__ import annotations

import ast
import importlib.machinery
import inspect
import sys
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from typing import Optional

UNKNOWN = inspect.Parameter.empty


@dataclass(frozen=True)
class Found:
    """What a module's source says of a name: ``defined`` (None: the source cannot tell), its parameters
    when they can be read without running anything (else None), and the module's other public names."""

    defined: Optional[bool]
    params: Optional[list[inspect.Parameter]]
    names: list[str]


def find_module(module: str) -> tuple[Optional[ModuleSpec], int]:
    """``module``'s spec, found as ``import`` would on ``sys.path`` without executing any package
    (None: not found that way), and how many of its dotted parts were found (the packages above it)."""
    if module in sys.modules:
        return getattr(sys.modules[module], "__spec__", None), len(module.split("."))
    search = None
    spec = None
    parts = module.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, search)
        except KeyError:  # a namespace package inside a package: its path asks sys.modules for the parent
            spec = _namespace(name, search or [])
        except (ImportError, ValueError):
            return None, i
        if spec is None:
            return None, i
        locations = spec.submodule_search_locations
        search = list(locations) if locations is not None else None
        if search is None and i < len(parts) - 1:
            return None, i + 1
    return spec, len(parts)


def _namespace(name: str, search: list[str]) -> Optional[ModuleSpec]:
    """The namespace package ``name`` (PEP 420: directories without ``__init__.py``) under the parent's
    ``search`` locations, as ``import`` would make it once its parent were imported; None when none holds it."""
    import os

    portions = [os.path.join(location, name.rsplit(".", 1)[-1]) for location in search]
    portions = [portion for portion in portions if os.path.isdir(portion)]
    if not portions:
        return None
    spec = ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = portions
    return spec


def module_source(module: str) -> Optional[str]:
    """The path of ``module``'s Python source, found as ``import`` would on ``sys.path`` without
    executing any package; None when it is not a plain source file there (or not found)."""
    spec, _ = find_module(module)
    origin = spec.origin if spec is not None else None
    return origin if isinstance(origin, str) and origin.endswith(".py") else None


def lookup(path: str, name: str) -> Found:
    """What the source file at ``path`` defines as ``name`` at its top level."""
    try:
        with open(path, "rb") as fh:
            tree = ast.parse(fh.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return Found(None, None, [])
    definitions: dict[str, ast.AST] = {}
    uncertain: set[str] = set()  # defined twice, or under a condition: which definition holds is known at run time
    opaque = False  # a star import or a module __getattr__: any name may exist

    def define(defined: str, node: ast.AST, conditional: bool) -> None:
        if defined in definitions or conditional:
            uncertain.add(defined)
        definitions[defined] = node

    for node, conditional in _top_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            define(node.name, node, conditional)
            opaque |= node.name == "__getattr__"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    opaque = True
                else:
                    define(alias.asname or alias.name.split(".")[0], node, conditional)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        define(leaf.id, node, conditional)
    names = sorted(n for n in definitions if not n.startswith("_"))
    node = definitions.get(name)
    if node is None:
        return Found(None if opaque else False, None, names)
    return Found(True, None if name in uncertain else _params(node), names)


def _top_level(body: list[ast.stmt], conditional: bool = False):
    """The statements of a module's top level, into ``if``/``try``/``with`` blocks (definitions made
    under a condition, such as an optional import), each with whether it is under one."""
    for node in body:
        yield node, conditional
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            inner = conditional or not isinstance(node, ast.With)
            for block in ("body", "orelse", "finalbody"):
                yield from _top_level(getattr(node, block, []), inner)
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                yield from _top_level(handler.body, True)


def _params(node: ast.AST) -> Optional[list[inspect.Parameter]]:
    """The parameters of a plain function, or of a class's own ``__init__`` (without ``self``); None
    when they cannot be read from the source alone (decorators, a class without its own ``__init__``
    or with a metaclass or decorators, anything else)."""
    if isinstance(node, ast.ClassDef):
        if node.decorator_list or node.keywords:
            return None
        init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is None:
            return None
        params = _params(init)
        return params[1:] if params else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.decorator_list:
        return None
    args = node.args
    P = inspect.Parameter
    positional = [(a, P.POSITIONAL_ONLY) for a in args.posonlyargs] + [(a, P.POSITIONAL_OR_KEYWORD) for a in args.args]
    first_default = len(positional) - len(args.defaults)
    params = [P(a.arg, kind, default=UNKNOWN if i < first_default else None) for i, (a, kind) in enumerate(positional)]
    if args.vararg:
        params.append(P(args.vararg.arg, P.VAR_POSITIONAL))
    params += [P(a.arg, P.KEYWORD_ONLY, default=UNKNOWN if d is None else None)
               for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        params.append(P(args.kwarg.arg, P.VAR_KEYWORD))
    return params
