"""The README's main job: `baton demo` survives a SIGKILLed worker and ends bit-exact; run from any
directory (its job ships inside the package), and a machine without its local services is told, in
one line, what to install."""
from __future__ import annotations

import pytest

import re
import shutil
import subprocess
import sys
import zipfile

from tests.helpers import REPO, baton_env


def _demo(cwd, *args: str, prelude: str = "", timeout: float = 600) -> subprocess.CompletedProcess:
    """``baton demo`` in a fresh process started in ``cwd``, after ``prelude`` (Python) has run."""
    env = baton_env()
    for name in ("BATON_REDIS_URL", "AWS_ENDPOINT_URL"):
        env.pop(name, None)
    code = f"{prelude}\nimport sys; sys.argv = ['baton', 'demo', *sys.argv[1:]]\nfrom baton.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_demo_runs_end_to_end_from_a_directory_without_the_examples(tmp_path):
    result = _demo(tmp_path, "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stdout + result.stderr
    killed = re.search(r"SIGKILL to demo-\S+ \(pid \d+\) right after the job committed its checkpoint at step (\d+)",
                       result.stdout)
    assert killed, result.stdout  # (mid-run, however fast the machine: it once killed after the last step)
    resumed = re.search(r"job succeeded: attempt 2 on \S+, resumed from step (\d+)", result.stdout)
    assert resumed and int(killed[1]) <= int(resumed[1]) < 760, result.stdout
    assert "bit-exact: all" in result.stdout
    assert list((tmp_path / "out").glob("*/best.pt")) and list((tmp_path / "out").glob("*/model.safetensors"))


def test_without_the_local_extra_the_demo_says_what_to_install(tmp_path):
    result = _demo(tmp_path, "--out", str(tmp_path / "out"), prelude="import sys; sys.modules['moto'] = None",
                   timeout=60)  # (moto not importable: an install without baton[local])
    said = (result.stdout + result.stderr).strip()
    assert result.returncode == 2, said
    assert said.splitlines() == [said] and "pip install 'baton[local]'" in said, said
    assert not (tmp_path / "out").exists()


def test_a_wheel_ships_the_demos_job(tmp_path):
    """Built from a copy of the tree (a build/ left in the checkout could still hold the file)."""
    source = tmp_path / "src"
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    for name in listed:
        if (REPO / name).exists() or (REPO / name).is_symlink():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name, follow_symlinks=False)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp_path / "dist").glob("baton-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("baton/jobs/demo_spiral.yaml") == (REPO / "examples" / "spiral.yaml").read_bytes()
