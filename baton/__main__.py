"""``python -m baton``: the ``baton`` command."""
from baton.cli import main

main()
