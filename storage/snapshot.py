"""Copying a training state to host memory, into buffers reused from one checkpoint to the next.

This copy is the only part of a checkpoint the training loop waits for. On CUDA the buffers are
pinned and the copies non-blocking; the stream is synchronised before ``take`` returns, so the
loop may modify the live tensors (optimizer.step) as soon as it gets control back.
"""
from __future__ import annotations

from typing import Any

import torch


class HostSnapshot:
    def __init__(self, pin_memory: bool = False):
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self._buffers: dict[str, torch.Tensor] = {}
        self._copied_from_cuda = False

    def take(self, state: Any) -> Any:
        """A copy of ``state`` whose tensors live in this snapshot's host buffers.

        The buffers are overwritten by the next ``take``: the caller must be done with the
        previous copy (serialized it) before taking another.
        """
        self._copied_from_cuda = False
        copy = self._walk(state, "")
        if self._copied_from_cuda:
            torch.cuda.current_stream().synchronize()
        return copy

    def wait_for_copies(self) -> None:
        """Nothing to wait for: every copy has completed when ``take`` returns."""

    def _walk(self, obj: Any, path: str) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._copy_tensor(obj, path)
        if isinstance(obj, dict):
            return {k: self._walk(v, f"{path}/{k}") for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            items = [self._walk(v, f"{path}/{i}") for i, v in enumerate(obj)]
            return items if isinstance(obj, list) else tuple(items)
        return obj  # ints, floats, strings, None: immutable

    def _copy_tensor(self, tensor: torch.Tensor, path: str) -> torch.Tensor:
        buf = self._buffers.get(path)
        if buf is None or buf.shape != tensor.shape or buf.dtype != tensor.dtype:
            pin = self.pin_memory and tensor.is_cuda
            buf = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
            self._buffers[path] = buf
        non_blocking = tensor.is_cuda and buf.is_pinned()
        buf.copy_(tensor.detach(), non_blocking=non_blocking)
        self._copied_from_cuda |= tensor.is_cuda
        return buf
