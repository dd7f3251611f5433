"""Reference tables generated from baton's own code, so the docs cannot drift from it.

A page asks for a table with a pair of markers, HTML comments on lines of their own, and the
generated Markdown sits between them, committed, so the pages read whole on GitHub too:

    <!-- spec-reference -->       every JobSpec field, one table per section (Field descriptions)
    <!-- builtins-reference -->   the kwargs of every built-in model, data set and task
    <!-- settings-reference -->   the BATON_* settings (BatonSettings)
    <!-- metrics-row-reference --> the fields of a metrics row (MetricsRow)
    <!-- manifest-reference -->   the fields of manifest.json (CheckpointManifest)
    <!-- cli-reference -->        every `baton` command, its arguments and options (the Typer app)
    <!-- rooms-reference -->      the rooms of the code, what each may import and what it does import
                                  (``import_graph.py``, which ``tests/test_layout.py`` checks)

each closed by the same comment with a slash (``<!-- /spec-reference -->``). Refresh the pages
after changing the code with ``python docs/hooks/reference.py``. As an MkDocs hook the file
builds the site from freshly generated tables and warns for each page whose committed tables are
stale, and for a marker no page holds, so ``mkdocs build --strict`` fails on either.

baton must be installed where this runs (``pip install -e ".[docs]"``: an editable install reads
this checkout).
"""
from __future__ import annotations

import logging
import re
import typing
from enum import Enum
from typing import Any, Callable

log = logging.getLogger("mkdocs.hooks.reference")

_generated: dict[str, str] = {}
_used: set[str] = set()


# --------------------------------------------------------------------------------------------
# Rendering types and values
# --------------------------------------------------------------------------------------------

def _cell(text: str) -> str:
    """Text (a description from the code) safe inside a Markdown table cell: one line, pipes escaped,
    and outside `code spans` no accidental emphasis (``__getitem__``, ``**kwargs``) or HTML."""
    parts = " ".join(str(text).split()).split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = parts[i].replace("\\", "\\\\").replace("*", "\\*").replace("_", "\\_").replace("<", "&lt;")
    return "`".join(parts).replace("|", "\\|")


def _is_model(tp: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _type_name(tp: Any) -> str:
    """A readable name for an annotation: ``int or null``, ``one of `a`, `b```, ``list of float``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any"
    if origin is typing.Union or (origin is not None and getattr(origin, "__name__", "") == "UnionType"):
        names = [_type_name(a) for a in args if a is not type(None)]
        text = " or ".join(names)
        return f"{text} or null" if type(None) in args else text
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin in (list, typing.List):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {_type_name(args[0])}"
        if args and all(a == args[0] for a in args):
            return f"list of {len(args)} {_type_name(args[0])}"
        return "list (" + ", ".join(_type_name(a) for a in args) + ")"
    if origin in (dict, typing.Dict):
        return "mapping"
    if _is_model(tp):
        return "mapping"
    if isinstance(tp, type) and issubclass(tp, Enum):
        return "one of " + ", ".join(f"`{m.value}`" for m in tp)
    if isinstance(tp, type):
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(tp.__name__, tp.__name__)
    return str(tp).replace("typing.", "")


def _bounds(field: Any) -> str:
    """Numeric bounds from a field's metadata: ``> 0, ≤ 1024``."""
    found = []
    for item in field.metadata:
        for attr, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            value = getattr(item, attr, None)
            if value is not None and not isinstance(value, bool):
                found.append(f"{sign} {_value(value)}")
    return ", ".join(found)


def _value(value: Any) -> str:
    """A value as it would be written in a YAML spec."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, float):
        text = repr(value)
        if "e" in text or len(text) > 8:
            text = f"{value:g}"
        return text
    if isinstance(value, int):
        if value >= 2**32 and value & (value - 1) == 0:  # 2**63, not 9223372036854775808
            return f"2^{value.bit_length() - 1}"
        return str(value)
    if isinstance(value, str) and not value:
        return '""'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.is_required():
        return "required"
    if field.default_factory is not None:
        made = field.default_factory()
        if _is_model(type(made)):
            return "see below"
        return f"`{_value(made)}`"
    if field.default is PydanticUndefined:
        return ""
    return f"`{_value(field.default)}`"


def _inner_model(tp: Any) -> Any:
    """The model class inside ``Optional[Model]`` or ``Model``; None otherwise."""
    if _is_model(tp):
        return tp
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is typing.Union and len(args) == 1 and _is_model(args[0]):
        return args[0]
    return None


def _field_rows(model: type, prefix: str, expand: bool = True,
                names: dict[type, str] | None = None) -> list[tuple[str, str, str, str]]:
    """(dotted path, type, default, description) of every field; nested models walked in place
    (``expand``), or named by ``names`` (a model class -> how the table calls it)."""
    rows = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        kind = _type_name(field.annotation)
        for cls, label in (names or {}).items():
            if cls in (field.annotation, *typing.get_args(field.annotation)):
                kind = kind.replace("mapping", label, 1)
        bounds = _bounds(field)
        if bounds:
            kind = f"{kind} ({bounds})"
        description = field.description or UNDESCRIBED.get((model.__name__, name), "")
        rows.append((path, kind, _default(field), description))
        inner = _inner_model(field.annotation)
        if expand and inner is not None:
            rows.extend(_field_rows(inner, f"{path}."))
    return rows


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    """A Markdown table; the first column (a field, a variable, an option) in code."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [f"`{row[0]}`"] + [_cell(c) for c in row[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


FIELD_HEADER = ("field", "type", "default", "description")

UNDESCRIBED = {
    ("CheckpointManifest", "version"): "Format version of the manifest.",
    ("CheckpointManifest", "job_id"): "The job's id.",
}
"""Descriptions for the few fields the code leaves without one (the rest come from ``Field(description=...)``)."""


# --------------------------------------------------------------------------------------------
# The generated sections
# --------------------------------------------------------------------------------------------

def spec_reference() -> str:
    from baton.schemas.spec import JobSpec

    top, sections = [], []
    for name, field in JobSpec.model_fields.items():
        inner = _inner_model(field.annotation)
        if inner is None:
            top.append(_field_rows_single(name, field))
            continue
        required = "Required." if field.is_required() else "Optional: every field below has a default."
        sections.append("\n".join([
            f"### `{name}`", "",
            f"{field.description or ''} {required}".strip(), "",
            _table(_field_rows(inner, f"{name}."), FIELD_HEADER),
        ]))
    head = "\n".join(["### Top level", "", _table(top, FIELD_HEADER)])
    return "\n\n".join([head, *sections]) + "\n"


def _field_rows_single(name: str, field: Any) -> tuple[str, str, str, str]:
    kind = _type_name(field.annotation)
    bounds = _bounds(field)
    return (name, f"{kind} ({bounds})" if bounds else kind, _default(field), field.description or "")


def builtins_reference() -> str:
    from baton.schemas.builtins import BUILTIN_DATA, BUILTIN_MODELS, BUILTIN_TASKS

    parts = []
    for title, registry, where in (("Models", BUILTIN_MODELS, "model.target"), ("Data sets", BUILTIN_DATA, "data.target"),
                                   ("Tasks", BUILTIN_TASKS, "task.target")):
        parts.append(f"### {title}")
        for name, kwargs_model in registry.items():
            rows = _field_rows(kwargs_model, "")
            parts.append(f"#### `builtin:{name}`")
            parts.append(f"`{where}: builtin:{name}`, with these `kwargs`:" if rows else
                         f"`{where}: builtin:{name}` takes no `kwargs`.")
            if rows:
                parts.append(_table(rows, ("kwarg", "type", "default", "description")))
    return "\n\n".join(parts) + "\n"


def settings_reference() -> str:
    from baton.schemas.settings import BatonSettings

    rows = []
    for name, field in BatonSettings.model_fields.items():
        kind = _type_name(field.annotation)
        bounds = _bounds(field)
        rows.append((f"BATON_{name.upper()}", f"{kind} ({bounds})" if bounds else kind,
                     _default(field), field.description or ""))
    return _table(rows, ("variable", "type", "default", "description")) + "\n"


def metrics_row_reference() -> str:
    from baton.schemas.metrics import MetricsRow

    rows = _field_rows(MetricsRow, "")
    rows.append(("val_NAME", "number", "", "Each validation metric the task reports (classification: val_loss, "
                                             "val_accuracy)."))
    return _table(rows, FIELD_HEADER) + "\n"


def manifest_reference() -> str:
    from baton.schemas.manifest import (BestEntry, CheckpointEntry, CheckpointManifest, FinalArtifacts, MetricsRef,
                                        ObjectRef)

    names = {CheckpointEntry: "checkpoint entry", BestEntry: "best entry", MetricsRef: "metrics entry",
             FinalArtifacts: "final entry", ObjectRef: "object reference"}
    own = lambda model, base: [r for r in _field_rows(model, "", expand=False, names=names)  # noqa: E731
                               if r[0] not in base.model_fields]
    parts = [
        _table(_field_rows(CheckpointManifest, "", expand=False, names=names), FIELD_HEADER),
        "An **object reference** is `{key, size, sha256}`:",
        _table(_field_rows(ObjectRef, ""), FIELD_HEADER),
        "A **checkpoint entry** (each of `checkpoints`) is an object reference plus:",
        _table(own(CheckpointEntry, ObjectRef), FIELD_HEADER),
        "The **best entry** is a checkpoint entry plus:",
        _table(own(BestEntry, CheckpointEntry), FIELD_HEADER),
        "The **metrics entry** is an object reference plus:",
        _table(own(MetricsRef, ObjectRef), FIELD_HEADER),
        "The **final entry**:",
        _table(_field_rows(FinalArtifacts, "", expand=False, names=names), FIELD_HEADER),
    ]
    return "\n\n".join(parts) + "\n"


def _click_context(command: Any, name: str, parent: Any = None) -> Any:
    """A context for ``command`` (click's, or the copy of click a newer Typer carries)."""
    return command.context_class(command, info_name=name, parent=parent)


def _param_type(param: Any, ctx: Any) -> str:
    if getattr(param, "is_flag", False):
        return "flag"
    click_type = getattr(param, "type", None)
    if click_type is not None and getattr(click_type, "name", None):
        name = click_type.name.lower()
    else:
        display = getattr(param, "display_type", None)
        name = display(ctx) if callable(display) else str(param.param_type_name)
        name = name.strip("<>")
        name = name.removeprefix("list[").removesuffix("]") if getattr(param, "multiple", False) else name
    name = {"str": "text", "text": "text", "int range": "integer", "integer range": "integer", "int": "integer",
            "path": "path", "bool": "boolean", "boolean": "boolean"}.get(name, name)
    low = getattr(param, "min", None)
    if low is None and click_type is not None:
        low = getattr(click_type, "min", None)
    if low is not None:
        name = f"{name} (≥ {low})"
    if getattr(param, "multiple", False):
        name = f"{name}, repeatable"
    return name


def _param_default(param: Any) -> str:
    if param.required:
        return "required"
    if getattr(param, "is_flag", False) and not getattr(param, "secondary_opts", None):
        return "off" if not param.default else "on"
    if param.default is None or param.default == () or param.default == []:
        return ""
    return f"`{param.default}`"


def _param_help(param: Any) -> str:
    text = getattr(param, "help", None) or ""
    if not text and param.param_type_name == "argument":
        text = f"The {param.name.replace('_', ' ')}."
    return text


def _param_name(param: Any) -> str:
    if param.param_type_name == "argument":
        return param.name.upper()
    names = " / ".join([", ".join(param.opts), *[", ".join(param.secondary_opts)] * bool(param.secondary_opts)])
    return names


def cli_reference() -> str:
    import typer

    from baton.cli import app

    group = typer.main.get_command(app)
    root_ctx = _click_context(group, "baton")
    parts = []
    commands = []  # (name, command, its parent's context): a group's commands (`baton quota set`) in its place
    for name, command in group.commands.items():
        subcommands = getattr(command, "commands", None)
        if subcommands:
            group_ctx = _click_context(command, name, root_ctx)
            commands += [(f"{name} {sub}", subcommand, group_ctx) for sub, subcommand in subcommands.items()]
        else:
            commands.append((name, command, root_ctx))
    for name, command, parent_ctx in commands:
        if getattr(command, "hidden", False):
            continue
        ctx = _click_context(command, name.split()[-1], parent_ctx)
        usage = ["baton", *name.split()]
        if any(p.param_type_name == "option" for p in command.params):
            usage.append("[OPTIONS]")
        for param in command.params:
            if param.param_type_name == "argument":
                usage.append(param.name.upper() if param.required else f"[{param.name.upper()}]")
        parts.append(f"### `baton {name}`")
        parts.append("```text\n" + " ".join(usage) + "\n```")
        parts.append((command.help or "").strip())
        rows = [(_param_name(p), _param_type(p, ctx), _param_default(p), _param_help(p))
                for p in command.params if not getattr(p, "hidden", False)]
        if rows:
            parts.append(_table(rows, ("argument / option", "type", "default", "description")))
    return "\n\n".join(parts) + "\n"


def rooms_reference() -> str:
    """The rooms, bottom floor first: what each may import (the rule) and imports (read from the code)."""
    import importlib.util
    import pathlib

    spec = importlib.util.spec_from_file_location("import_graph", pathlib.Path(__file__).with_name("import_graph.py"))
    graph = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(graph)
    edges = graph.room_graph()
    order = sorted(graph.ROOMS, key=lambda room: (len(graph.ROOMS[room]), room))

    storage = {room for room in graph.ROOMS if room == "baton.storage" or room.startswith("baton.storage.")}

    def names(rooms: set) -> str:
        shown = sorted(rooms - storage) + (["baton.storage.*"] if storage <= rooms else sorted(rooms & storage))
        return ", ".join(f"`{room}`" for room in sorted(shown)) or "nothing of baton's"

    rows = [(room, names(graph.ROOMS[room]), names(edges.get(room, set()))) for room in order]
    return _table(rows, ("room", "may import", "imports"))


MARKERS: dict[str, Callable[[], str]] = {
    "<!-- spec-reference -->": spec_reference,
    "<!-- builtins-reference -->": builtins_reference,
    "<!-- settings-reference -->": settings_reference,
    "<!-- metrics-row-reference -->": metrics_row_reference,
    "<!-- manifest-reference -->": manifest_reference,
    "<!-- cli-reference -->": cli_reference,
    "<!-- rooms-reference -->": rooms_reference,
}


# --------------------------------------------------------------------------------------------
# Filling pages
# --------------------------------------------------------------------------------------------

def _block(marker: str) -> re.Pattern:
    """A marker pair standing on lines of their own, and what lies between (a marker quoted in prose
    is left alone)."""
    name = marker[len("<!-- "):-len(" -->")]
    return re.compile(rf"^([ \t]*{re.escape(marker)}[ \t]*\n)(.*?)^([ \t]*<!-- /{re.escape(name)} -->[ \t]*)$",
                      re.M | re.S)


def fill(markdown: str, generated: dict[str, str]) -> tuple[str, set[str]]:
    """The page with every marker pair's contents replaced by the generated table, and the markers
    it holds."""
    found: set[str] = set()
    for marker, text in generated.items():
        markdown, count = _block(marker).subn(lambda m: f"{m[1]}\n{text}\n{m[3]}", markdown)
        if count:
            found.add(marker)
    return markdown, found


def generate() -> dict[str, str]:
    return {marker: make() for marker, make in MARKERS.items()}


# --------------------------------------------------------------------------------------------
# MkDocs events
# --------------------------------------------------------------------------------------------

def on_pre_build(config: Any, **kwargs: Any) -> None:
    """Generate every table once per build."""
    _generated.clear()
    _used.clear()
    _generated.update(generate())


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    filled, found = fill(markdown, _generated)
    _used.update(found)
    if filled != markdown:
        log.warning("reference hook: the generated tables in %s are stale: run `python docs/hooks/reference.py`",
                    page.file.src_path)
    return filled


def on_post_build(config: Any, **kwargs: Any) -> None:
    for marker in MARKERS:
        if marker not in _used:
            log.warning("reference hook: no page holds the marker pair %s", marker)


if __name__ == "__main__":  # refresh the committed tables in every page
    import pathlib

    tables = generate()
    for page in sorted((pathlib.Path(__file__).resolve().parents[1]).rglob("*.md")):
        text = page.read_text()
        filled, _ = fill(text, tables)
        if filled != text:
            page.write_text(filled)
            print(f"refreshed {page}")
