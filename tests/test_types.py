"""The type check: mypy over the package, as configured in pyproject.toml (the level is in
docs/architecture.md#types). It runs from a fresh checkout: every baton.* import resolves through
the links under baton/, not through setuptools' editable hook, which type checkers cannot follow."""
from __future__ import annotations

import pytest

import subprocess
import sys

from tests.helpers import REPO


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One mypy cache for this file's checks: the second reads what the first found of baton, torch and the rest."""
    return tmp_path_factory.mktemp("mypy-cache")


@pytest.mark.slow
def test_mypy_passes_and_resolves_every_baton_import(cache):
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout, done.stdout


@pytest.mark.slow
def test_an_unresolved_baton_import_is_an_error_not_an_unchecked_any(tmp_path, cache):
    """A misspelled module of baton's must fail the check (the library's missing stubs may be ignored)."""
    probe = tmp_path / "probe.py"
    probe.write_text("from baton.workers.queue.no_such_module import anything\nfrom baton.schemas.spec import JobSpec\n"
                     "spec: JobSpec = 1\n")
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache), str(probe)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'Cannot find implementation or library stub for module named "baton.workers.queue.no_such_module"' \
        in done.stdout, done.stdout
    assert 'Incompatible types in assignment (expression has type "int", variable has type "JobSpec")' in done.stdout
