# baton's GPU worker image. Build from the repository root:  docker build -t baton-worker:0.1.0 .
# The base image brings Python, a CUDA build of torch and cuDNN; baton's `torch>=2.4` is then
# already satisfied, so pip installs no second torch.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CUBLAS_WORKSPACE_CONFIG=:4096:8

WORKDIR /opt/baton
COPY pyproject.toml README.md ./
COPY baton ./baton
COPY schemas ./schemas
COPY storage ./storage
COPY workers ./workers
COPY jobs ./jobs
COPY dashboard ./dashboard
COPY searches ./searches
# mlflow: the client (mlflow-skinny), so setting MLFLOW_TRACKING_URI on a worker is enough to track its jobs;
# ui: the same image serves the dashboard (`baton ui --host 0.0.0.0`, port 8265); search: its workers decide searches
RUN pip install ".[digits,mlflow,ui,search]" \
 && useradd --create-home --uid 10001 --shell /usr/sbin/nologin baton \
 && chmod 0755 /home/baton

USER baton
# (readable by all: a root worker, as the deployment's files run it, runs each job as a user of its own, which
# imports from the worker's directory)
WORKDIR /home/baton
# Prometheus /metrics (BATON_METRICS_PORT; with --gpus N, ports 9100..9100+N-1)
EXPOSE 9100 8265
# Healthy while the worker can reach its Redis (BATON_REDIS_URL).
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 CMD ["baton", "health"]
# SIGTERM: checkpoint at the next step, release the job, exit within BATON_PREEMPT_GRACE_S.
STOPSIGNAL SIGTERM
CMD ["baton", "worker"]
