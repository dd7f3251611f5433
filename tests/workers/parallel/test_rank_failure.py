"""A data-parallel job whose own code raises on rank 1 only fails as a single-process job whose code
raises: with rank 1's exception and traceback, not retried. Only a rank killed by a signal (or gone)
is a worker loss: ``test_ddp.py`` and ``test_ddp_workers.py`` SIGKILL rank 1 and expect a loss."""
from __future__ import annotations

import re

import pytest

from tests.helpers import make_spec, run_baton, write_spec

# rank 1 raises on its 41st sample: in its third step (2 ranks x 16 samples per step)
FAILING = make_spec(data={"target": "tests.probes:failing_on_rank",
                          "kwargs": {"n_per_class": 150, "rank": 1, "after": 40}, "batch_size": 16},
                    loop={"epochs": 1}, checkpoint={"every_steps": 2}, resources={"processes": 2})
CAUSE = r"ValueError: sample \d+ is unreadable on rank 1 \(on rank 1 of 2\)"
WHERE = r"while loading sample \d+ of the training set \(its index in your data set\)"


@pytest.mark.slow
def test_baton_run_shows_the_exception_rank_1_raised_with_its_own_frames(tmp_path):
    url = f"file://{tmp_path / 'store'}"
    done = run_baton("run", str(write_spec(tmp_path, FAILING)), "--id", "bad", "--storage", url)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    errors = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert errors and re.fullmatch(f"error: {CAUSE}", lines[errors[0]]), done.stderr
    report = "\n".join(lines[errors[0]:])
    assert re.search(rf"\n  {WHERE}\n  while training step 3 \(epoch 1, its batch 3\)\n", report), report
    assert "Traceback (your code's frames, most recent call last):" in report
    frames = re.findall(r'File "([^"]+)"', report)
    assert frames and all(path.endswith("tests/probes.py") for path in frames), report
    assert lines[-1] == f"the whole traceback is in the job's log: baton logs bad --storage {url}"
    assert "RankLost" not in done.stderr + done.stdout
    log = run_baton("logs", "bad", "--storage", url).stdout  # rank 1's whole traceback
    assert re.search(r"workers/training/data\.py.*tests/probes\.py.*ValueError: sample \d+ is unreadable on rank 1",
                     log, re.S), log


@pytest.mark.slow
def test_a_worker_fails_the_job_with_rank_1s_exception_and_does_not_retry_it(cluster):
    cluster.start_workers(1)
    spec = make_spec(**{**FAILING, "retry": {"max_attempts": 3}})
    final = cluster.client.submit(spec, "rankbad").wait(timeout=180, progress=False)
    assert (final.state.value, final.attempt, final.lost) == ("failed", 1, 0), final.error
    assert re.fullmatch(rf"{CAUSE}; {WHERE}; while training step 3 \(epoch 1, its batch 3\)", final.error), final.error
    assert re.search(r"Traceback \(most recent call last\):\n.*tests/probes\.py.*\n"
                     r"ValueError: sample \d+ is unreadable on rank 1\n", final.traceback, re.S), final.traceback
    assert "RankLost" not in final.traceback


def test_a_collective_broken_under_a_rank_is_not_the_jobs_failure():
    """A rank whose collective broke because a peer died (gloo reports it as a plain RuntimeError, even
    from inside the job's forward) is lost, not failed: on a job of several ranks a node, where another
    node's loss breaks every survivor's collective, the job must be retried rather than failed."""
    from baton.workers.parallel.failure_report import is_job_failure

    broken = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                          "[127.0.0.1]:35001")
    assert not is_job_failure(broken)
    try:
        try:
            raise broken
        except RuntimeError as inner:
            raise ValueError("the task's forward failed") from inner
    except ValueError as wrapped:
        assert not is_job_failure(wrapped)
    assert is_job_failure(RuntimeError("CUDA error: an illegal memory access"))  # the job's own
    assert is_job_failure(ValueError("sample 3 is unreadable"))


def test_what_is_not_a_report_in_the_ranks_directory_is_skipped_not_raised(tmp_path):
    """A rank runs the job's code, which can write anything where reports go; the worker of a follower
    node reads them too. A forged file (a string where the time goes, JSON nested past the recursion
    limit, an oversized file) is skipped; the real report is found."""
    import json

    from baton.workers.parallel import failure_report

    try:
        raise ValueError("the job's own error")
    except ValueError as exc:
        failure_report.write(tmp_path, 1, exc)
    forged = {2: json.dumps({"rank": 2, "at_ns": "0", "exception": "forged", "traceback": ""}),
              3: "[" * 100_000 + "]" * 100_000, 4: '{"rank": 4, "at_ns": 0.5, "exception": "forged", "traceback": ""}',
              5: json.dumps({"rank": 5, "at_ns": 0, "exception": "x" * failure_report.MAX_BYTES, "traceback": ""})}
    for rank, text in forged.items():
        failure_report.report_path(tmp_path, rank).write_text(text)
    report = failure_report.read_earliest(tmp_path)
    assert report is not None and (report.rank, report.exception) == (1, "ValueError: the job's own error")
