"""A batch array that is reused from batch to batch instead of allocated anew.

A fresh 50 x 196 x 2048 float16 batch is 40 MB: above glibc's mmap threshold,
so every allocation maps new pages and faults each one in, which costs about
as much as reading the records. A reader that hands ``BatchBuffer`` to
``read_batch(allocate=...)`` writes into the same memory each time (pinned
memory on a GPU machine, so the copy to the device can be asynchronous).
The caller must be done with one batch before reading the next into it.
"""

from __future__ import annotations

import numpy as np
import torch


class BatchBuffer:
    """``allocate(shape, dtype)`` returning a view of one growing buffer."""

    def __init__(self, pin_memory: bool = False):
        self.pin_memory = pin_memory
        self._storage: torch.Tensor | None = None

    def __call__(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if self._storage is None or self._storage.numel() < nbytes:
            self._storage = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin_memory)
        return self._storage[:nbytes].numpy().view(dtype).reshape(shape)
