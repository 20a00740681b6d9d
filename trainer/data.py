"""Feature stores + prepared captions -> batches.

A training batch holds ``B`` images and ``seq_per_img`` captions of each:
features ``[B, L, D]`` (float16 until on the device), a mask ``[B, L]`` of the
valid locations (region sets are padded), and captions ``[B*S, T+2]`` as
``<bos> w1 .. wn <eos> <pad>..``. Batches are read a whole batch per store call
in the main process (benchmarks/store_reads.py: DataLoader workers cost more
than they bring to the reads alone), unless ``data.readers`` is N > 0: then N
reader processes make whole training batches (reads, padding, captions) ahead
of the step, in the epoch's order, and hand them over in shared memory (pinned
on CUDA), which takes the reads off the training thread and its GIL
(benchmarks/training_reads.py). The order of an epoch is a function of (seed,
epoch) alone, so a resumed run sees exactly the batches the uninterrupted one
would have, with any number of readers.
"""

from __future__ import annotations

import logging
import signal
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import DataLoader, Dataset

from pipeline.captions.prepared import Captions
from pipeline.core.errors import CapstackError
from pipeline.core.ranks import Ranks
from pipeline.core.tokens import BOS_ID as BOS
from pipeline.core.tokens import EOS_ID as EOS
from pipeline.core.tokens import PAD_ID as PAD
from pipeline.features.stores import Batch, Record, open_store
from pipeline.features.stores.buffer import BatchBuffer
from trainer.batch import EvalBatch, Share, TrainBatch, _local

log = logging.getLogger(__name__)

BUCKET_SPAN = 50  # batches whose images are sorted by caption length together
GEOMETRY_DIM = 5
BATCHINGS = ("images", "length_buckets", "one_length")


def caption_tensor(labels: np.ndarray, lengths: np.ndarray) -> torch.Tensor:
    """[N, max_len] word ids -> [N, max_len + 2]: <bos> words <eos> <pad>..."""
    n, max_len = labels.shape
    out = np.full((n, max_len + 2), PAD, np.int64)
    out[:, 0] = BOS
    out[:, 1:max_len + 1] = labels
    out[np.arange(n), 1 + lengths] = EOS
    return torch.from_numpy(out)


# --------------------------------------------------------------------------- features

class Features:
    """One or more stores read as one set of locations per image (concatenated along L)."""

    def __init__(self, paths: Sequence[str | Path], max_regions: int = 0,
                 box_geometry: bool = False):
        self.stores = [open_store(p) for p in paths]  # a pointer .json is followed there
        self.paths = [s.path for s in self.stores]
        self.max_regions = max_regions
        self.box_geometry = box_geometry
        if box_geometry and not all(s.schema.has("boxes") for s in self.stores):
            raise CapstackError("data.box_geometry: needs stores with boxes (" + ", ".join(
                f"{p}: {s.schema.describe()}" for p, s in zip(self.paths, self.stores)) + ")")
        unsized = [p for p, s in zip(self.paths, self.stores)
                   if s.meta.get("image_size_known") is False]
        if box_geometry and unsized:
            raise CapstackError(f"data.box_geometry: {unsized[0]} does not know its images' "
                                f"sizes (its source records none): import it again with "
                                f"--image-root, or set data.box_geometry: false")
        dims = {s.feature_dim + (GEOMETRY_DIM if box_geometry else 0) for s in self.stores}
        if len(dims) > 1:
            raise CapstackError(f"stores {', '.join(map(str, self.paths))}: feature dims differ "
                                f"({sorted(dims)}); stores read together need one dim")
        self.feature_dim = dims.pop()
        # allocate(shape, dtype) of each store's reads: a reused buffer (a reader process: fresh)
        self.buffers: list[Callable[..., np.ndarray]] = [BatchBuffer() for _ in self.stores]

    @property
    def grid_size(self) -> int | None:
        """k when the features are one store of k x k grids (for attention pictures)."""
        return self.stores[0].schema.grid if len(self.stores) == 1 else None

    def describe(self) -> list[dict]:
        """What a checkpoint records of the stores it was trained on."""
        return [{"path": str(s.path), "fingerprint": s.meta["fingerprint"],
                 "feature_dim": s.feature_dim} for s in self.stores]

    def missing(self, image_ids: Sequence[int]) -> tuple[Path, int] | None:
        for store in self.stores:
            lacking = store.missing(image_ids)
            if lacking:
                return store.path, lacking[0]
        return None

    def read(self, image_ids: Sequence[int]
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """features [B, L, D] float16 (a view of a reused buffer), mask [B, L], boxes or None."""
        batches = [store.read_batch(image_ids, max_rows=self.max_regions or None,
                                    allocate=buffer, fields=self.boxes_of(store))
                   for store, buffer in zip(self.stores, self.buffers)]
        for store, batch in zip(self.stores, batches):
            refuse_empty(store.path, image_ids, batch.mask)
        return combine(batches, self.box_geometry)

    @staticmethod
    def boxes_of(store) -> tuple[str, ...]:
        return ("boxes",) if store.schema.has("boxes") else ()


def refuse_empty(store: Path, image_ids: Sequence[int], mask: np.ndarray) -> None:
    """A record with no regions (a store made before capstack skipped them) would be an
    all-masked image, whose attention is NaN: named here, not as a NaN loss."""
    empty = ~mask.any(1)
    if empty.any():
        image_id = int(np.asarray(image_ids)[empty.argmax()])
        raise CapstackError(f"{store}: image {image_id}: a record with no regions (0 rows), "
                            f"nothing to attend to; `capstack verify --deep` names every such "
                            f"record: import or extract the store again")


def combine(batches: Sequence[Batch], with_geometry: bool = False):
    """Store batches of the same images -> one set of locations per image, concatenated along L.

    Boxes come back only for a single region store (what attention pictures can draw).
    """
    parts, masks, boxes = [], [], []
    for batch in batches:
        feats = torch.from_numpy(batch.features)
        if with_geometry:
            feats = torch.cat([feats, box_geometry(batch).to(feats.dtype)], 2)
        parts.append(feats)
        masks.append(torch.from_numpy(batch.mask))
        if "boxes" in batch.fields:
            boxes.append(torch.from_numpy(batch.fields["boxes"]))
    if len(parts) == 1:
        return parts[0], masks[0], boxes[0] if boxes else None
    return torch.cat(parts, 1), torch.cat(masks, 1), None


def batch_from_records(records: Sequence[Record], dtype: npt.DTypeLike,
                       max_rows: int = 0) -> Batch:
    """Records fresh from an extractor, padded like a store's ``read_batch`` (in its dtype)."""
    rows = max(r.num for r in records)
    rows = min(rows, max_rows) if max_rows else rows
    dim = records[0].features.shape[1]
    features = np.zeros((len(records), rows, dim), dtype)
    mask = np.zeros((len(records), rows), bool)
    with_boxes = records[0].get("boxes") is not None
    boxes = np.zeros((len(records), rows, 4), np.float32)
    for k, r in enumerate(records):
        n = min(r.num, rows)
        features[k, :n] = r.features[:n]
        mask[k, :n] = True
        if with_boxes:
            boxes[k, :n] = r["boxes"][:n]
    hw = np.array([(r.height, r.width) for r in records], np.int32)
    return Batch(features, mask, hw, {"boxes": boxes} if with_boxes else {})


def box_geometry(batch) -> torch.Tensor:
    """[B, N, 5]: each box as fractions of its image, and its area fraction (Anderson et al.'s
    spatial features); what lets attention over regions tell left from right."""
    boxes = torch.from_numpy(batch.fields["boxes"])  # [B, N, 4] image pixels
    hw = torch.from_numpy(batch.hw).float()  # [B, 2]
    scale = torch.stack([hw[:, 1], hw[:, 0], hw[:, 1], hw[:, 0]], 1)[:, None]  # [B, 1, 4]
    rel = boxes / scale
    area = (rel[..., 2] - rel[..., 0]) * (rel[..., 3] - rel[..., 1])
    return torch.cat([rel, area[..., None]], 2) * torch.from_numpy(batch.mask)[..., None]


# --------------------------------------------------------------------------- batches

class TrainBatches:
    """The train split's batches, epoch by epoch, in an order fixed by (seed, epoch).

    Under DDP every rank computes the same global batches and reads the
    features of its own contiguous part of each (``ranks.share``): a global
    batch, its captions and so a run's losses do not depend on the number of
    processes, and a checkpoint's (epoch, batch) means the same position for
    any number of them. (torch's ``DistributedSampler`` deals each rank its own
    batches, whose union changes with the number of ranks.) A batch with fewer
    images than ranks leaves some ranks without: they run its first image with
    weight 0, so that every rank takes part in the gradient all-reduce.

    ``batching`` says what a batch is:

    - ``images`` (the default): ``batch_size`` images in a random order, each with
      ``seq_per_img`` of its captions;
    - ``length_buckets``: the same, images of similar mean caption length together;
    - ``one_length``: Show, Attend and Tell's minibatches, ``batch_size x seq_per_img``
      captions of one length (after truncation), each with its own image (an image may come
      twice), every caption of the split once per epoch.
    """

    def __init__(self, captions: Captions, features: Features, *, batch_size: int,
                 seq_per_img: int, seed: int, batching: str = "images", split: str = "train",
                 ranks: Ranks = Ranks(), readers: int = 0):
        self.captions, self.features = captions, features
        self.rows = captions.rows(split)
        if len(self.rows) == 0:
            raise CapstackError(f"{captions.folder}: the {split} split has no images")
        if batching not in BATCHINGS:
            raise CapstackError(f"batching: expected one of {', '.join(BATCHINGS)}, "
                                f"got {batching!r}")
        self.batch_size, self.seq_per_img = batch_size, seq_per_img
        self.seed, self.batching = seed, batching
        self.ranks = ranks
        self.readers = readers  # processes that make the batches (0: the caller's thread)
        self.all_captions = caption_tensor(captions.labels, captions.lengths)
        if batching == "one_length":
            self.caption_rows, self.caption_images = self.captions_of(self.rows)

    def captions_of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every caption row of image ``rows``, and the image row of each."""
        start, end = self.captions.label_start[rows], self.captions.label_end[rows]
        images = np.repeat(rows, end - start)
        captions = np.concatenate([np.arange(a, b) for a, b in zip(start, end)] or [np.empty(0)])
        order = np.argsort(captions, kind="stable")  # sorted: batch() looks images up in it
        return captions.astype(np.int64)[order], images[order]

    def __len__(self) -> int:
        if self.batching == "one_length":
            return sum(-(-n // self.captions_per_batch) for n in np.unique(
                self.captions.lengths[self.caption_rows], return_counts=True)[1])
        return -(-len(self.rows) // self.batch_size)

    @property
    def captions_per_batch(self) -> int:
        return self.batch_size * self.seq_per_img

    def order(self, epoch: int) -> list[np.ndarray]:
        """The epoch's batches as arrays of image rows (``one_length``: of caption rows)."""
        rng = np.random.default_rng([self.seed, epoch])
        if self.batching == "one_length":
            return self.one_length_order(rng)
        rows = rng.permutation(self.rows)
        if self.batching == "images":
            return np.array_split(rows, range(self.batch_size, len(rows), self.batch_size))
        mean_len = self.mean_caption_length(rows)
        span = self.batch_size * BUCKET_SPAN
        batches = []
        for start in range(0, len(rows), span):
            window = slice(start, start + span)
            chunk = rows[window][np.argsort(mean_len[window], kind="stable")]
            batches += np.array_split(chunk, range(self.batch_size, len(chunk), self.batch_size))
        return [batches[k] for k in rng.permutation(len(batches))]

    def one_length_order(self, rng: np.random.Generator) -> list[np.ndarray]:
        """Caption rows grouped by length, each group shuffled and cut into batches, the
        batches of every length shuffled together."""
        captions = rng.permutation(self.caption_rows)
        lengths = self.captions.lengths[captions]
        n = self.captions_per_batch
        batches = []
        for length in np.unique(lengths):
            same = captions[lengths == length]
            batches += np.array_split(same, range(n, len(same), n))
        return [batches[k] for k in rng.permutation(len(batches))]

    def mean_caption_length(self, rows: np.ndarray) -> np.ndarray:
        c = self.captions
        total = np.concatenate([[0], np.cumsum(c.lengths)])
        start, end = c.label_start[rows], c.label_end[rows]
        return (total[end] - total[start]) / np.maximum(end - start, 1)

    def epoch(self, epoch: int, start: int = 0, pin_memory: bool = False
              ) -> Iterator[TrainBatch]:
        """The epoch's batches from ``start``: made here, or by :attr:`readers` processes
        (``pin_memory``: in page-locked memory, for a GPU's asynchronous copies)."""
        if self.readers:
            yield from self.read_by_workers(epoch, start, pin_memory)
            return
        for index, rows in enumerate(self.order(epoch)):
            if index >= start:
                yield self.made(epoch, index, rows)

    def made(self, epoch: int, index: int, rows: np.ndarray) -> TrainBatch:
        """Batch ``index`` of ``epoch`` (its image or caption ``rows``)."""
        return self.batch(rows, np.random.default_rng([self.seed, epoch, index]), index)

    def read_by_workers(self, epoch: int, start: int, pin_memory: bool) -> Iterator[TrainBatch]:
        """The epoch's batches from ``start``, in order, made by :attr:`readers` worker
        processes (forked: the stores reopen themselves in a child), each a whole batch, handed
        over in shared memory."""
        epoch_batches = EpochBatches(self, epoch, start)
        loader = DataLoader(epoch_batches, batch_size=None, shuffle=False,
                            num_workers=self.readers, pin_memory=pin_memory,
                            prefetch_factor=2, worker_init_fn=_fresh_buffers)
        readers = iter(loader)  # the processes start here
        index = start
        with _deaths_raised_where_awaited():
            try:
                for batch in readers:  # the ranks' sum was left behind: it does not cross processes
                    yield replace(batch, share=replace(batch.share, total=self.ranks.sum))
                    index += 1
            except (RuntimeError, OSError, EOFError):  # torch's, or a batch it handed on
                # before it died whose shared memory can no longer be fetched from it
                death = _reader_death(readers)
                if death is None:
                    raise
                raise CapstackError(
                    f"data.readers: {death} while batch {index + 1} of epoch {epoch + 1} was "
                    f"awaited; training stopped: the same train command resumes the run from "
                    f"its last checkpoint") from None
            finally:
                readers._shutdown_workers()  # type: ignore[attr-defined]  # now, not when collected

    def batch(self, rows: np.ndarray, rng: np.random.Generator, index: int = 0) -> TrainBatch:
        """The global batch ``rows``' captions, then this rank's part of it with its features
        (``one_length``: ``rows`` are caption rows, one caption for each image)."""
        if self.batching == "one_length":
            s, picked = 1, rows
            rows = self.caption_images[np.searchsorted(self.caption_rows, picked)]
        else:
            s = self.seq_per_img
            picked = np.concatenate([self.pick_captions(r, rng) for r in rows])
        captions = self.all_captions[picked]
        part, weight = self.ranks.share(len(rows)), 1.0
        if part.start == part.stop:  # fewer images than ranks: pad with weight 0
            part, weight = slice(0, 1), 0.0
        share = Share(tokens=int((captions[:, 1:] != PAD).sum()), captions=len(captions),
                      images=len(rows), first=part.start, weight=weight, total=self.ranks.sum)
        image_ids = self.captions.image_ids[rows[part]].tolist()
        feats, mask, _ = self.features.read(image_ids)
        return TrainBatch(image_ids, feats, mask, captions[part.start * s:part.stop * s], share,
                          index, s)

    def pick_captions(self, row: int, rng: np.random.Generator) -> np.ndarray:
        """``seq_per_img`` of the image's caption rows: without replacement when it has enough."""
        start, end = int(self.captions.label_start[row]), int(self.captions.label_end[row])
        n, s = end - start, self.seq_per_img
        if n == 0:
            raise CapstackError(f"{self.captions.folder}: image {self.captions.image_ids[row]} "
                                f"has no captions")
        return start + (rng.choice(n, s, replace=False) if n >= s else rng.choice(n, s))


class EpochBatches(Dataset):
    """Item k: batch ``start + k`` of ``epoch``, made in a reader process; its tensors in
    shared memory, its :class:`Share` without the ranks' sum (added back by the trainer)."""

    def __init__(self, batches: TrainBatches, epoch: int, start: int):
        self.batches, self.epoch, self.start = batches, epoch, start
        self.order = batches.order(epoch)

    def __len__(self) -> int:
        return len(self.order) - self.start

    def __getitem__(self, k: int) -> TrainBatch:
        index = self.start + k
        batch = self.batches.made(self.epoch, index, self.order[index])
        return replace(batch, share=replace(batch.share, total=_local))


@contextmanager
def _deaths_raised_where_awaited():
    """torch's DataLoader learns of a dead reader process from a SIGCHLD handler that raises
    wherever the training thread is (in a step, a checkpoint's writing) and again at each
    later SIGCHLD while the epoch's readers are not shut down, the run's ending included, where
    it cut the writing of ``state.json``. Set aside while they read, the iterator still finds a
    dead reader where its batch is awaited (it looks every few seconds), raised there alone."""
    try:
        handler = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    except ValueError:  # not the main thread: torch set no handler either
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, handler)


def _reader_death(readers) -> str | None:
    """Which reader process of a DataLoader iterator ended, and how; None when none did."""
    processes = readers._workers
    for number, process in enumerate(processes, 1):
        code = process.exitcode
        if code is None:
            continue
        if code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
            if -code == signal.SIGKILL:
                how += " (the out-of-memory killer, or kill -9: fewer data.readers or a " \
                       "smaller train.batch_size need less memory)"
        else:
            how = f"exited with status {code}"
        return f"reader process {number} of {len(processes)} (pid {process.pid}) {how}"
    return None


def _fresh_buffers(worker: int) -> None:
    """A reader process reads each batch into fresh arrays, not one reused buffer: a batch is
    handed over (moved into shared memory) after the next one is being read."""
    info = torch.utils.data.get_worker_info()
    assert info is not None and isinstance(info.dataset, EpochBatches), "a reader's dataset"
    features = info.dataset.batches.features
    features.buffers = [np.empty for _ in features.stores]


def eval_batches(captions: Captions, features: Features, split: str, batch_size: int,
                 limit: int = 0) -> Iterator[EvalBatch]:
    """The split's images in prepared order (the first ``limit`` when > 0)."""
    ids = captions.image_ids[captions.rows(split)].tolist()
    return batches_of(features, ids[:limit] if limit else ids, batch_size)


def batches_of(features: Features, image_ids: Sequence[int],
               batch_size: int) -> Iterator[EvalBatch]:
    """These images' features in batches (copied out of the reused read buffer)."""
    for start in range(0, len(image_ids), batch_size):
        chunk = list(image_ids[start:start + batch_size])
        feats, mask, boxes = features.read(chunk)
        yield EvalBatch(chunk, feats.clone(), mask.clone(), boxes)


def covered(captions: Captions, features: Features) -> Captions:
    """The captions of the images the stores hold: images a store skipped when it was made
    (unreadable, without features, a broken source row) are left out with a warning; an image
    neither held nor skipped means the stores are of another dataset, and is refused."""
    skipped: set[int] = set()
    for store in features.stores:
        reasons = store.meta.get("skipped", {})
        lacking = store.missing(captions.image_ids.tolist())
        unexplained = [i for i in lacking if str(i) not in reasons]
        if unexplained:
            raise CapstackError(f"{store.path}: lacks image {unexplained[0]} of "
                                f"{captions.folder} (made from another dataset?)")
        skipped.update(lacking)
    if skipped:
        first = sorted(skipped)[:5]
        log.warning("%d images left out: the feature stores skipped them when they were made "
                    "(`capstack inspect STORE` says why); first %s", len(skipped),
                    ", ".join(map(str, first)))
    return captions.without(skipped) if skipped else captions
