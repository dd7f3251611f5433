"""The asynchronous checkpointer: the host snapshot the loop waits for, its buffers (shared with the
writer process where it can be), and a checkpoint's storage half (serialize, upload, commit) in a
thread or a process of its own. Imports ``baton.schemas``, the stores and the checkpoint format."""
