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
