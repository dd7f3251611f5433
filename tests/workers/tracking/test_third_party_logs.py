"""A job's log holds what the job and baton say: the INFO chatter of the libraries a tracker uses is
kept out (their warnings and errors still show)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import baton_env

pytest.importorskip("tensorboard")


def test_tensorboards_info_lines_stay_out_of_a_jobs_log(tmp_path):
    """A worker logs at INFO; reading an attempt's event files back (as a resume does) made TensorBoard
    say "No path found after ..." on the job's stderr, which is the job's log."""
    code = ("import logging; logging.basicConfig(level=logging.INFO)\n"
            "import baton.workers.tracking.tensorboard\n"
            "from torch.utils.tensorboard import SummaryWriter\n"
            "from tensorboard.backend.event_processing import event_accumulator\n"
            f"writer = SummaryWriter({str(tmp_path)!r}); writer.add_scalar('loss', 1.0, 1); writer.close()\n"
            f"reader = event_accumulator.EventAccumulator({str(tmp_path)!r}); reader.Reload(); reader.Reload()\n"
            "assert reader.Scalars('loss')[0].value == 1.0\n"
            "logging.getLogger('tensorboard').warning('a warning still shows')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=baton_env(), timeout=60)
    assert result.returncode == 0, result.stderr
    assert "No path found" not in result.stderr and "a warning still shows" in result.stderr, result.stderr
