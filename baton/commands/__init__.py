"""The ``baton`` command's commands (``baton.cli`` runs the app): ``common`` (the app and what every
command shares), ``local`` (validate, run), ``jobs`` (the queue's jobs), ``workers`` (worker, health, demo)."""
