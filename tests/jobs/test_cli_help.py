"""The CLI's help renders every option's text whole (rich once ate "[default: ...]" as markup)."""
from __future__ import annotations

import re

import pytest

from tests.helpers import run_baton


@pytest.mark.parametrize("command", ["run", "submit", "worker"])
def test_help_texts_keep_their_defaults(command):
    result = run_baton(command, "--help")
    assert result.returncode == 0, result.stderr
    text = re.sub(r"[│\s]+", " ", result.stdout)
    assert not re.search(r"\w \.", text), f"a help text lost its words before a period: {text}"
    assert "(default:" in text


def test_the_version_is_one_line():
    from importlib.metadata import version

    result = run_baton("--version")
    assert result.returncode == 0 and result.stdout == f"baton {version('baton')}\n", result
