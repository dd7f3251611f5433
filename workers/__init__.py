"""The Celery app, the run_job task, leases and fencing, preemption, and the training loop."""
