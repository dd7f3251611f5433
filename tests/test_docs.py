"""The documentation: the site builds with ``mkdocs build --strict`` (broken links and anchors fail
it), its reference pages are generated from the code, the README stays a landing page, and neither
speaks of the project's development history."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from baton.schemas.spec import JobSpec
from tests.helpers import REPO

README = REPO / "README.md"
HISTORY = re.compile(r"\b(issue|defect|sitting|session)s? #?\d+|\bthis sitting\b|\bsince reverted\b|\bwas fixed\b", re.I)


def field_paths(model: type, prefix: str = "") -> list[str]:
    from pydantic import BaseModel

    paths = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        paths.append(path)
        inner = [a for a in getattr(field.annotation, "__args__", (field.annotation,))
                 if isinstance(a, type) and issubclass(a, BaseModel)]
        for sub in inner:
            paths += field_paths(sub, f"{path}.")
    return paths


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_site_builds_strictly(site):
    assert (site / "index.html").exists()


def test_the_spec_reference_names_every_field_of_the_spec(site):
    page = (site / "spec" / "index.html").read_text()
    missing = [path for path in field_paths(JobSpec) if f"<code>{path}</code>" not in page]
    assert not missing, f"docs/spec.md does not show these spec fields: {missing}"


def test_the_cli_reference_names_every_command(site):
    from typer.main import get_command

    from baton.cli import app

    page = (site / "cli" / "index.html").read_text()
    names = [f"{name} {sub}" if sub else name for name, command in get_command(app).commands.items()
             for sub in (getattr(command, "commands", None) or [""])]
    assert "quota set" in names
    missing = [name for name in names if f"baton {name}" not in page]
    assert not missing, f"docs/cli.md does not show these commands: {missing}"


def test_the_readme_is_a_landing_page_with_the_two_setup_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert "./scripts/demo.sh" in text and "./scripts/test.sh" in text
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / target).exists(), f"the README links to {target}, which does not exist"


def test_user_docs_speak_of_baton_as_it_is_not_of_its_history():
    offenders = []
    for path in [README, *sorted((REPO / "docs").rglob("*.md"))]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if HISTORY.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_the_committed_reference_tables_are_those_the_code_generates():
    """The tables are committed between their markers (GitHub shows the pages whole); a change to a
    field's description or a CLI option's help must be followed by `python docs/hooks/reference.py`."""
    import importlib.util

    loaded = importlib.util.spec_from_file_location("reference_hook", REPO / "docs" / "hooks" / "reference.py")
    hook = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(hook)
    tables, held, stale = hook.generate(), set(), []
    for page in sorted((REPO / "docs").rglob("*.md")):
        text = page.read_text()
        filled, found = hook.fill(text, tables)
        held |= found
        if filled != text:
            stale.append(str(page.relative_to(REPO)))
    assert not stale, f"stale generated tables in {stale}: run `python docs/hooks/reference.py`"
    assert held == set(hook.MARKERS), f"no page holds {set(hook.MARKERS) - held}"
    assert all(tables[m].strip() for m in held)
