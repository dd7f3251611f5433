"""``python -m baton``: the ``baton`` command."""
from baton.jobs.cli import main

main()
