"""`baton worker --gpus`: which child process gets which device (no GPU needed)."""
from __future__ import annotations

import pytest

from baton.workers.queue.gpus import plan


def test_all_gives_one_child_per_gpu_each_pinned_to_its_own():
    children = plan("all", 1, {}, device_count=4, metrics_port=9100)
    assert [c["CUDA_VISIBLE_DEVICES"] for c in children] == ["0", "1", "2", "3"]
    assert [c["BATON_METRICS_PORT"] for c in children] == ["9100", "9101", "9102", "9103"]


def test_a_list_picks_those_gpus_in_that_order():
    assert [c["CUDA_VISIBLE_DEVICES"] for c in plan("3,1", 1, {}, device_count=4, metrics_port=0)] == ["3", "1"]
    assert [c["BATON_METRICS_PORT"] for c in plan("3,1", 1, {}, device_count=4, metrics_port=0)] == ["0", "0"]


def test_indices_count_the_devices_the_platform_left_visible():
    env = {"CUDA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}  # e.g. two GPUs a Kubernetes pod was given
    assert [c["CUDA_VISIBLE_DEVICES"] for c in plan("all", 1, env, device_count=2, metrics_port=0)] == ["GPU-aaa", "GPU-bbb"]
    assert [c["CUDA_VISIBLE_DEVICES"] for c in plan("1", 1, env, device_count=2, metrics_port=0)] == ["GPU-bbb"]


@pytest.mark.parametrize("gpus,count,message", [
    ("all", 0, "no CUDA device is visible"),
    ("0,0", 2, "twice"),
    ("2", 2, "out of range"),
    ("zero", 2, "'all' or comma-separated"),
])
def test_bad_gpu_lists_are_refused_naming_the_problem(gpus, count, message):
    with pytest.raises(ValueError, match=message):
        plan(gpus, 1, {}, device_count=count, metrics_port=0)


def test_without_gpus_concurrency_gives_that_many_cpu_children():
    children = plan(None, 3, {"CUDA_VISIBLE_DEVICES": "0"}, device_count=1, metrics_port=9100)
    assert children == [{"BATON_METRICS_PORT": "9100"}, {"BATON_METRICS_PORT": "9101"}, {"BATON_METRICS_PORT": "9102"}]


def test_gpus_per_job_groups_consecutive_gpus_into_one_worker_process():
    children = plan("all", 1, {}, device_count=8, metrics_port=0, per_job=4)
    assert [c["CUDA_VISIBLE_DEVICES"] for c in children] == ["0,1,2,3", "4,5,6,7"]
    assert [c["CUDA_VISIBLE_DEVICES"] for c in plan("all", 1, {}, device_count=8, metrics_port=0, per_job=8)] == ["0,1,2,3,4,5,6,7"]
    with pytest.raises(ValueError, match="does not divide"):
        plan("0,1,2", 1, {}, device_count=8, metrics_port=0, per_job=2)
