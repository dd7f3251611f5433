"""Object stores: the interface every backend implements (``base``), ``file://`` and ``s3://``, the one
way to open one from a URL (``open``), retries of transient errors, and the check that a store really
does conditional writes. Imports ``baton.schemas`` only."""
