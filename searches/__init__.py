"""Searches (``baton sweep SPEC --search FILE``): trials sampled by Optuna's samplers (``sampling``), run as
ordinary jobs of the queue, paused at rungs and compared there by successive halving (``driver``: the next
step, decided by whoever first sees it due, the client or the worker whose trial paused; ``asynchronous``:
ASHA's, where no rung waits), and shown as a table of trials, rungs and the best (``results``) and as a
report with a plot (``report``).

Imports ``baton.schemas`` and ``baton.storage`` only: the client and the workers both decide searches.
"""
