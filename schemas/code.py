"""The spec's ``code`` section: the user's code shipped with the job (a directory packed at submit, stored
under its digest) and the Python packages installed for it on the worker."""
from __future__ import annotations

from typing import Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import Field, field_validator

from baton.schemas.section import Section

DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
PROTECTED = ("torch", "baton")
"""Distributions a job's ``code.pip`` may not name: the worker's own (an overlay never replaces them)."""


class CodeSpec(Section):
    dir: Optional[str] = Field(
        None, description="A directory of your code, packed at submit and put first on the import path of the job's "
                          "processes on every worker (a relative path is taken from where you submit). Without it, "
                          "the job imports what the workers have installed.")
    exclude: tuple[str, ...] = Field(
        (), strict=False, description="Patterns (as in .gitignore) of files under dir left out of the archive, besides .git, "
                        "caches, virtual environments and what the directory's .gitignore files name.")
    pip: tuple[str, ...] = Field(
        (), strict=False, description="Requirements (`name==version`) installed on the worker, once per set, into an overlay "
                        "the job imports first; never torch or baton. Needs a package index the workers reach.")
    digest: Optional[str] = Field(
        None, pattern=DIGEST_PATTERN,
        description="The archive's sha256 (set at submit: every attempt on every worker runs this archive).")

    @field_validator("pip")
    @classmethod
    def _requirements(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for line in value:
            try:
                requirement = Requirement(line)
            except InvalidRequirement as exc:
                raise ValueError(f"{line!r} is not a requirement ({str(exc).splitlines()[0]})") from None
            if requirement.url is not None:
                raise ValueError(f"{line!r}: name a package of an index, not a URL")
            if canonicalize_name(requirement.name) in PROTECTED:
                raise ValueError(f"{line!r}: the worker's {requirement.name} is never replaced by a job's packages")
        return value

    @property
    def ships(self) -> bool:
        """Whether the job brings anything to its workers (an archive, or packages to install)."""
        return self.dir is not None or self.digest is not None or bool(self.pip)
