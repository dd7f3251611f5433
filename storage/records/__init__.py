"""The queue's shared state in Redis, read and written by both sides (``baton.jobs`` and the workers):
every key (``keys``), the connection (``connection``), a job's record and every change of it as one
atomic script (``job_records``), the scripts of a worker's hold on a job (``leases``), of a multi-node
job's gang (``gangs``), of the reaper's pass (``reaping``), the queues live workers serve
(``presence``), and the messages that deliver attempts through Celery (``messages``, ``celery_config``).

Imports ``baton.schemas`` and the floor of ``baton.storage`` only: nothing here runs a job.
"""
