"""What a job's environment keeps of its worker's (``job_env``): everything but the pool's credentials."""
from __future__ import annotations

from baton.workers.attempt.job_env import job_environment


def test_the_pools_credentials_are_left_out_and_the_rest_is_kept():
    worker = {
        "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_ENDPOINT_URL": "http://s3", "AWS_PROFILE": "p",
        "BATON_REDIS_URL": "redis://:pw@r:6379/0", "BATON_REDIS_SENTINEL_PASSWORD": "pw", "REDIS_URL": "redis://r",
        "CELERY_BROKER_URL": "redis://r", "BATON_STORAGE_URL": "s3://b/p", "BATON_SERVER_TOKEN": "t",
        "BATON_UI_TOKEN": "t", "baton_redis_url": "redis://r",
        "PATH": "/usr/bin", "HOME": "/home/w", "CUDA_VISIBLE_DEVICES": "0", "BATON_FAILPOINT": "x",
        "BATON_CHECKPOINT_WRITER": "thread", "BATON_COLLECTIVE_TIMEOUT_S": "60", "MLFLOW_TRACKING_URI": "http://m",
        "HF_TOKEN": "the job's own", "PYTHONPATH": "/code"}
    assert job_environment(worker) == {
        "PATH": "/usr/bin", "HOME": "/home/w", "CUDA_VISIBLE_DEVICES": "0", "BATON_FAILPOINT": "x",
        "BATON_CHECKPOINT_WRITER": "thread", "BATON_COLLECTIVE_TIMEOUT_S": "60", "MLFLOW_TRACKING_URI": "http://m",
        "HF_TOKEN": "the job's own", "PYTHONPATH": "/code"}


def test_an_operator_names_more_to_keep_from_jobs():
    worker = {"BATON_JOB_ENV_DROP": " GOOGLE_APPLICATION_CREDENTIALS, azure_* ,", "GOOGLE_APPLICATION_CREDENTIALS": "/k",
              "AZURE_CLIENT_SECRET": "s", "AZURE_TENANT": "t", "GOOGLE_CLOUD_PROJECT": "p"}
    assert job_environment(worker) == {"BATON_JOB_ENV_DROP": " GOOGLE_APPLICATION_CREDENTIALS, azure_* ,",
                                       "GOOGLE_CLOUD_PROJECT": "p"}


def test_the_deployment_files_hand_a_job_none_of_their_credentials():
    """deploy/docker-compose.yml gives a worker container all of deploy/.env: MinIO's root user, every Redis
    user's password, the tokens of the server and of a user."""
    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "deploy" / ".env.example"
    worker = dict(line.split("=", 1) for line in example.read_text().splitlines() if line and not line.startswith("#"))
    worker.update({"BATON_REDIS_URL": "redis://baton-worker:pw@redis:6379/0", "BATON_STORAGE_URL": "s3://baton/jobs",
                   "AWS_ENDPOINT_URL": "http://minio:9000", "BATON_UI_TOKEN": "u" * 16, "BATON_TOKEN": "t" * 16})
    left = job_environment(worker)
    secrets = {worker[n] for n in ("MINIO_ROOT_PASSWORD", "AWS_SECRET_ACCESS_KEY", "REDIS_WORKER_PASSWORD",
                                   "REDIS_SERVER_PASSWORD", "BATON_UI_TOKEN", "BATON_TOKEN")}
    assert not secrets & set(left.values()) and not any("pw@" in v for v in left.values()), left
    assert {"MINIO_ROOT_USER", "AWS_ACCESS_KEY_ID", "AWS_ENDPOINT_URL", "BATON_STORAGE_URL"}.isdisjoint(left)
    assert left["BATON_BACKGROUND_NICE"] == worker["BATON_BACKGROUND_NICE"]  # a tuning setting stays
