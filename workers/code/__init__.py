"""A job's shipped code on a worker: its archive checked and unpacked (``archive``), its ``code.pip``
packages installed beside the worker's environment (``packages``), and the worker's cache of both, each
directory checked before another job uses it (``cache``)."""
