"""The README's main job: `baton demo` survives a SIGKILLed worker and ends bit-exact."""
from __future__ import annotations

from tests.helpers import baton_env, run_baton


def test_demo_runs_end_to_end(tmp_path):
    env = baton_env()
    for name in ("BATON_REDIS_URL", "AWS_ENDPOINT_URL"):
        env.pop(name, None)
    result = run_baton("demo", "--out", str(tmp_path / "out"), env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SIGKILL to demo-" in result.stdout
    assert "job succeeded: attempt 2" in result.stdout
    assert "bit-exact: all" in result.stdout
    assert list((tmp_path / "out").glob("*/best.pt")) and list((tmp_path / "out").glob("*/model.safetensors"))
