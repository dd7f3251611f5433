"""The last step in host memory: copies of the training state taken every few steps into shared
memory slots, which the next attempt on the same machine resumes from after a crash. Imports
``baton.schemas`` and ``baton.storage``'s snapshot buffers."""
