"""The web dashboard (``baton ui``): a FastAPI application over the same Redis and store as the workers,
its JSON API, and the pages (static files shipped inside the package) that use it. Imports
``baton.jobs``, ``baton.schemas`` and ``baton.storage`` only (the command line starts it)."""
