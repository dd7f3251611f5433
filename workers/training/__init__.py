"""The training loop and everything a step needs: building the model, optimizer and scheduler from a
spec; the data pipeline and its exact position; tasks (a batch's loss and validation scores);
mixed precision and clipping; every RNG; the train state a checkpoint holds; the built-ins.

May import ``baton.schemas`` and ``baton.storage`` (the checkpointer it hands snapshots to), nothing
else of baton's: no Redis, no Celery, no tracking. The loop talks to whoever runs it through
``control.LoopControl``.
"""
