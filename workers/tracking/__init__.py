"""What a run leaves for people and their tools: the job's own log, TensorBoard event files, MLflow
runs, the report and its curves, and the worker's Prometheus metrics.

May import ``training`` (its ``LoopControl`` callbacks feed the trackers), ``baton.schemas``,
``baton.storage``. A tracker's failure is logged and counted; it never fails a job.
"""
