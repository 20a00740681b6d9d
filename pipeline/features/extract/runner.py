"""The extraction loop shared by grid and region extractors.

Three things overlap: images are decoded and transformed in DataLoader workers (or,
with a :class:`~pipeline.vision.jpeg.JpegDecoder`, only read there and decoded on
the device in the loop's thread, batch by batch), the model runs on whole batches in
the loop's thread, and a writer thread commits each batch's records (and its skipped
images) to the store at once, a few batches behind (``write_ahead``), so that an
LMDB or HDF5 commit does not hold up the next forward pass. A batch model may hand
back its records unfinished (a function that makes them, once the device's copy has
landed): the writer thread finishes them, and the loop's thread goes on to the next
batch while the device still works on this one. The batches are committed in order,
each whole, so the store holds the same records as a loop that writes in its own
thread (``write_ahead=0``). Images the store already holds are not read again, which
is how a killed extraction resumes. Ctrl-C stops at the next batch boundary, with
every finished batch committed first.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence, Union

import torch
from torch.utils.data import DataLoader

from pipeline.core.errors import CapstackError
from pipeline.core.interrupt import stop_at_batch_boundary
from pipeline.vision.images import ImageDataset, collate_images
from pipeline.vision.jpeg import JpegDecoder
from pipeline.features.stores import Record, StoreWriter

Records = Union[list[Record], Callable[[], list[Record]]]  # made, or to be made (finished)
BatchModel = Callable[[dict], Records]

WRITE_AHEAD = 2  # batches the model may run ahead of the store's commits


def finished(records: Records) -> list[Record]:
    """A batch model's records, made now if it handed back the function that makes them."""
    return records() if callable(records) else records


@dataclass
class LoopReport:
    extracted: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def images_per_s(self) -> float:
        return self.extracted / self.seconds if self.seconds else 0.0


NO_REGIONS = "no regions (0 boxes): nothing to caption from"


def run_extraction(items: Sequence[tuple[int, Path]], writer: StoreWriter,
                   model: BatchModel | None, transform, *, batch_size: int, workers: int,
                   progress: bool = True, pin_memory: bool = False,
                   write_ahead: int = WRITE_AHEAD,
                   decoder: JpegDecoder | None = None) -> LoopReport:
    """Extract every (image_id, path) not yet in ``writer`` and commit batch by batch; a
    skipped image is recorded as ``PATH: reason``. ``write_ahead``: batches the forward
    pass may run ahead of the commits (0: each batch committed before the next is read).
    ``decoder``: the workers only read JPEGs' bytes, and it decodes each batch's (None:
    the workers decode and ``transform`` every image)."""
    from tqdm import tqdm

    todo = [(i, p) for i, p in items if int(i) not in writer.done]
    report = LoopReport()
    if not todo:
        return report
    assert model is not None, "images to extract need the model (None: every image is done)"
    if writer.done:
        tqdm.write(f"resuming: {len(items) - len(todo)} of {len(items)} images already in "
                   f"{writer.partial}", file=sys.stderr)
    dataset, collate = ((ImageDataset(todo, transform), collate_images) if decoder is None
                        else (decoder.dataset(todo), decoder.collate))
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                        collate_fn=collate, pin_memory=pin_memory, persistent_workers=False)
    paths = {int(i): p for i, p in todo}
    started = time.perf_counter()
    bar = tqdm(total=len(todo), desc=writer.meta["producer"]["name"], unit="img",
               disable=not progress, initial=0)

    def commit(batch: dict, records: Records) -> None:
        skipped = [(i, f"{paths[int(i)]}: {reason}") for i, reason in batch["skipped"]]
        found = list(zip(batch["image_ids"], finished(records)))
        skipped += [(i, f"{paths[int(i)]}: {NO_REGIONS}") for i, r in found if not r.num]
        found = [(i, r) for i, r in found if r.num]
        writer.write(found, skipped)
        report.extracted += len(found)
        report.skipped += skipped
        bar.update(len(batch["image_ids"]) + len(batch["skipped"]))
        bar.set_postfix(skipped=len(report.skipped), refresh=False)

    with stop_at_batch_boundary() as state, bar, Committer(commit, write_ahead) as committer:
        for batch in loader:
            if decoder is not None:
                batch = decoder(batch)
            committer.put(batch, model(batch) if batch["image_ids"] else [])
            if state["stop"]:
                committer.drain()
                report.seconds = time.perf_counter() - started
                raise CapstackError(
                    f"interrupted: {len(writer.done)} of {len(items)} images are in "
                    f"{writer.partial}; run the same command again to resume")
        committer.drain()
    report.seconds = time.perf_counter() - started
    return report


_END = object()


class Committer:
    """``commit(batch, records)`` for each batch, in order, in a writer thread that runs at most
    ``depth`` batches behind (``depth`` 0: in the caller's thread, at once).

    An error of a commit is raised in the caller's thread, at its next :meth:`put` or
    :meth:`drain`; no batch after it is committed. Leaving the ``with`` block commits what
    was put before (also when it is left by an error, but not by a second Ctrl-C: that stops
    after the commit in progress), then stops the thread.
    """

    def __init__(self, commit: Callable[[dict, Records], None], depth: int):
        self.commit, self.depth = commit, depth
        self.error: BaseException | None = None
        self.abandon = False  # a second Ctrl-C: the batches not yet committed are dropped
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=max(depth, 1))
        self.thread = None
        if depth > 0:
            self.thread = threading.Thread(target=self._run, daemon=True,
                                           name="capstack-store-writer")
            self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            try:
                if item is _END:
                    return
                if self.error is None and not self.abandon:  # after an error: drop the rest
                    self.commit(*item)
            except BaseException as error:
                self.error = error
            finally:
                self.queue.task_done()

    def put(self, batch: dict, records: Records) -> None:
        self._raise()
        if self.thread is None:
            self.commit(batch, records)
        else:
            self.queue.put((batch, records))

    def drain(self) -> None:
        """Wait until every batch put is committed (raising a commit's error)."""
        if self.thread is not None:
            self.queue.join()
        self._raise()

    def _raise(self) -> None:
        if self.error is not None:  # it stays: nothing more is committed
            raise self.error

    def __enter__(self) -> Committer:
        return self

    def __exit__(self, kind, error, trace) -> None:
        if self.thread is not None:
            self.abandon = kind is not None and issubclass(kind, KeyboardInterrupt)
            self.queue.put(_END)
            self.thread.join()


def autocast(device: torch.device, half: bool = True):
    """float16 autocast on CUDA (unless ``half`` is False); nothing on the CPU (where it would
    only slow down)."""
    if device.type == "cuda" and half:
        return torch.autocast("cuda", dtype=torch.float16)
    return torch.autocast(device.type, enabled=False)
