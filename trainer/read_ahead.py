"""A GPU run's batches, read ahead of the step that uses them and kept in pinned memory.

On a GPU, a step's kernels run while Python goes on. Reading the next batch from the store
(and padding, collating) in the same thread as the step leaves the GPU idle while it runs; a
reader thread makes it while the step's kernels run, and pins its tensors, so that
``TrainBatch.to(device)``'s copies are asynchronous (``non_blocking`` from pinned memory) and
queue behind the step. A CPU run reads in the loop's thread: there the step already has every
core, and a reader thread would take them from it.

The batches and their order are those of the iterator given (a function of seed, epoch and
batch index), whichever thread makes them. The store readers are safe to share: LMDB read
transactions are opened per read (py-lmdb sets MDB_NOTLS), h5py holds its own lock.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterator, TypeVar

import torch

Item = TypeVar("Item")
_END = object()


def read_ahead(batches: Iterator[Item], device: torch.device, depth: int = 2) -> Iterator[Item]:
    """``batches`` as they come, ``depth`` of them made ahead in pinned memory on CUDA."""
    if device.type != "cuda":
        yield from batches
        return
    reader = _Reader(batches, depth)
    try:
        yield from reader
    finally:
        reader.close()


class _Reader:
    """A daemon thread that fills a bounded queue; an error is raised where the batch was
    awaited; closing (the loop ended, or raised) stops the thread at its next batch."""

    def __init__(self, batches: Iterator, depth: int):
        self.queue: queue.Queue[tuple[Any, BaseException | None]]  # (batch, None) or (None, error)
        self.batches, self.queue, self.stop = batches, queue.Queue(maxsize=depth), threading.Event()
        self.thread = threading.Thread(target=self._fill, daemon=True, name="capstack-read-ahead")
        self.thread.start()

    def _fill(self) -> None:
        try:
            for batch in self.batches:
                if not self._put((batch.pin_memory(), None)):
                    return
            self._put((_END, None))
        except BaseException as error:  # handed to the loop's thread, raised there
            self._put((None, error))

    def _put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self):
        while True:
            batch, error = self.queue.get()
            if error is not None:
                raise error
            if batch is _END:
                return
            yield batch

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
