"""Object stores: the interface every backend implements (``base``), ``file://`` and ``s3://``, the one
way to open one from a URL (``open``), and retries of transient errors. Imports ``baton.schemas`` only."""
