"""Packing a job's code at submit: the same files give the same digest, what is left out is left out,
and a directory too large, missing or shadowing the worker's own packages is refused in one line."""
from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from baton.jobs.code_pack import pack
from baton.schemas.errors import SpecError

from tests.helpers import baton_env, make_spec, run_baton, write_spec


def project(root: Path) -> Path:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("X = 1\n")
    (root / "pkg" / "sub" / "m.py").write_text("Y = 2\n")
    (root / "pkg" / "sub" / "gen.py").write_text("generated\n")
    (root / "pkg" / "sub" / ".gitignore").write_text("gen.py\n")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref\n")
    (root / "env").mkdir()
    (root / "env" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / "data").mkdir()
    (root / "data" / "weights.bin").write_bytes(b"w" * 1000)
    (root / ".gitignore").write_text("data/\n*.log\n!keep.log\n")
    (root / "run.log").write_text("noise\n")
    (root / "keep.log").write_text("kept\n")
    (root / "big.ckpt").write_bytes(b"c" * 10)
    (root / "train.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "train.sh", 0o755)
    return root


def names(data: bytes) -> dict[str, int]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {member.name: member.mode for member in tar.getmembers()}


def test_what_goes_in_and_what_is_left_out(tmp_path):
    packed = pack(project(tmp_path / "p"), exclude=["*.ckpt"])
    assert names(packed.data) == {".gitignore": 0o644, "keep.log": 0o644, "pkg/__init__.py": 0o644,
                                  "pkg/sub/.gitignore": 0o644, "pkg/sub/m.py": 0o644, "train.sh": 0o755}
    assert packed.files == 6


def test_the_digest_depends_on_paths_and_contents_only(tmp_path):
    root = project(tmp_path / "p")
    first = pack(root)
    os.utime(root / "pkg" / "__init__.py", (1, 1))
    os.chmod(root / "pkg" / "__init__.py", 0o600)
    assert pack(root).digest == first.digest
    copied = project(tmp_path / "q")  # another directory, made at another time: the same files
    assert pack(copied).digest == first.digest
    (root / "pkg" / "__init__.py").write_text("X = 2\n")
    assert pack(root).digest != first.digest


def test_a_link_to_a_file_outside_the_directory_is_refused(tmp_path):
    root = project(tmp_path / "p")
    (tmp_path / "credentials").write_text("secret\n")
    (root / "creds").symlink_to(tmp_path / "credentials")
    with pytest.raises(SpecError, match="creds links to .*outside"):
        pack(root)
    (root / "creds").unlink()
    (root / "inside.py").symlink_to(root / "pkg" / "__init__.py")  # inside: shipped as the file it names
    assert "inside.py" in names(pack(root).data)


def test_a_directory_over_the_limit_is_refused_naming_its_largest_files(tmp_path):
    root = project(tmp_path / "p")
    (root / "pkg" / "table.csv").write_bytes(b"t" * 5000)
    with pytest.raises(SpecError) as refused:
        pack(root, limit_bytes=1000)
    assert "over the limit" in str(refused.value) and "pkg/table.csv (0.0 MB)" in str(refused.value)


@pytest.mark.parametrize("shadow", ["torch/__init__.py", "baton.py"])
def test_code_that_would_shadow_the_workers_own_packages_is_refused(tmp_path, shadow):
    root = project(tmp_path / "p")
    (root / shadow).parent.mkdir(exist_ok=True)
    (root / shadow).write_text("")
    with pytest.raises(SpecError, match="would shadow the worker's own"):
        pack(root)


def test_submit_with_a_missing_code_directory_says_so_in_one_line(tmp_path, redis_server):
    spec = write_spec(tmp_path, make_spec())
    done = run_baton("submit", str(spec), "--code", str(tmp_path / "nowhere"),
                     env=baton_env(BATON_REDIS_URL=redis_server.url, BATON_STORAGE_URL=f"file://{tmp_path / 's'}"))
    assert done.returncode == 2, done.stderr
    assert "code.dir:" in done.stderr and "is not a directory" in done.stderr and "Traceback" not in done.stderr


def test_a_pip_set_naming_torch_is_refused_at_submit(tmp_path, redis_server):
    spec = write_spec(tmp_path, make_spec(code={"pip": ["torch==2.0.0"]}))
    done = run_baton("submit", str(spec), env=baton_env(BATON_REDIS_URL=redis_server.url,
                                                        BATON_STORAGE_URL=f"file://{tmp_path / 's'}"))
    assert done.returncode == 2 and "never replaced" in done.stderr, done.stderr


def test_baton_run_with_a_missing_code_directory_says_so(tmp_path):
    spec = write_spec(tmp_path, make_spec(code={"dir": str(tmp_path / "nowhere")}))
    done = run_baton("run", str(spec), "--storage", f"file://{tmp_path / 's'}")
    assert done.returncode == 2 and "code.dir:" in done.stderr and "not a directory" in done.stderr, done.stderr


def test_shipping_the_package_folder_instead_of_its_parent_is_refused_at_submit(tmp_path, redis_server):
    root = project(tmp_path / "p")
    (root / "pkg" / "sub" / "m.py").write_text("def net():\n    pass\n")  # (pkg.sub: a namespace package)
    spec = write_spec(tmp_path, make_spec(model={"target": "pkg.sub.m:net", "kwargs": {}}))
    env = baton_env(BATON_REDIS_URL=redis_server.url, BATON_STORAGE_URL=f"file://{tmp_path / 's'}",
                    BATON_ALLOWED_MODULES="pkg")
    for where in (env, {**env, "PYTHONPATH": f"{root}{os.pathsep}{env['PYTHONPATH']}"}):  # (importable here too)
        done = run_baton("submit", str(spec), "--code", str(root / "pkg"), env=where)
        assert done.returncode == 2, done.stderr
        assert f"is the package 'pkg' itself: ship its parent, {root}" in done.stderr, done.stderr
        assert "stored under" not in done.stderr and len(done.stderr.strip().splitlines()) <= 2  # (nothing was)
    done = run_baton("submit", str(spec), "--code", str(tmp_path), env=env)  # the parent of the project: the store too
    assert done.returncode == 2 and "holds the job store" in done.stderr, done.stderr
    done = run_baton("submit", str(spec), "--code", str(root), env=env)  # right: its namespace package is found
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
