"""One extraction from settings to a complete, shared, named store.

:func:`extract` asks the registered kind whose settings it is given for an
:class:`Extraction` and runs it as an :class:`ExtractionJob`, which holds
everything the steps below need. The store is named
``<kind>-<backbone>-<fingerprint>`` (kind: grid or regions, the extractor's
word) and placed, reused and published as every store is
(pipeline/features/placement.py). Under torchrun each process extracts a shard
and rank 0 merges them into the one store (pipeline/features/extract/shards.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import pipeline
from pipeline.captions.karpathy import load_karpathy
from pipeline.core.hashing import HashCache
from pipeline.core.ranks import Ranks, join, pick_device
from pipeline.core.runlock import exclusive_beside
from pipeline.features.extract.runner import WRITE_AHEAD, BatchModel, run_extraction
from pipeline.features.extract.shards import check_shards_fit, merge_shards, shard_items, shard_path
from pipeline.features.fingerprint import fingerprint, images_digest
from pipeline.features.placement import check_reusable, features_root, publish, store_path
from pipeline.features.stores import Schema, create_writer
from pipeline.vision.images import karpathy_items
from pipeline.vision.jpeg import JpegDecoder


@dataclass
class Extraction:
    """What a kind hands a job (:meth:`ExtractorKind.prepare`): the store's word, what
    determines its features, and the model that makes them."""

    kind: str  # grid | regions: the store's name and the fingerprint say it
    backbone: str
    settings: dict  # everything else that determines the features (fingerprinted)
    describe: dict  # metadata that does not change the features (layer text, weights path)
    schema: Schema  # the fields of every record the extractor makes
    dtype: str
    make_model: Callable[[], BatchModel]  # called only when some image is left to extract
    transform: Callable  # PIL image -> the model's input tensor (picklable: workers)
    pin_memory: bool = False
    decoder: JpegDecoder | None = None  # JPEGs decoded on the device, not in the workers


@dataclass
class ExtractionJob:
    """One extraction: what (the kind's :class:`Extraction`), from which images, into which
    store, and how (batches, workers)."""

    extraction: Extraction
    dataset_json: Path
    image_root: Path
    out: Path | None = None
    root: Path | None = None
    format: str | None = None
    pointer: Path | None = None
    batch_size: int = 16
    workers: int = 2
    progress: bool = True
    images_outside_root: bool = False  # the user opted in to ../ and absolute image paths
    write_ahead: int = WRITE_AHEAD  # batches the forward pass may run ahead of the commits


@dataclass
class JobResult:
    store: Path
    fingerprint: str
    reused: bool
    extracted: int = 0
    skipped: int = 0
    seconds: float = 0.0  # extracting (the slowest process's, when sharded)
    shards: int = 0  # processes whose shards were merged into the store (0: one process)

    @property
    def images_per_s(self) -> float:
        return self.extracted / self.seconds if self.seconds else 0.0


def extract(dataset_json: Path, image_root: Path, settings, *, out: Path | None = None,
            root: Path | None = None, format: str | None = None, pointer: Path | None = None,
            batch_size: int = 16, workers: int = 2, device: str | None = None,
            progress: bool = True, images_outside_root: bool = False,
            write_ahead: int = WRITE_AHEAD) -> JobResult:
    """Extract (or reuse) the store of the registered kind whose ``settings`` these are
    (``write_ahead`` 0: each batch committed before the next is read; the same records)."""
    from pipeline.features.extract.kinds import kind_of  # the kinds, which import this module

    dev = pick_device(device)
    extraction = kind_of(settings).prepare(settings, Path(dataset_json), dev)
    return run_job(ExtractionJob(extraction, Path(dataset_json), Path(image_root), out=out,
                                 root=root, format=format, pointer=pointer,
                                 batch_size=batch_size, workers=workers, progress=progress,
                                 images_outside_root=images_outside_root,
                                 write_ahead=write_ahead))


def run_job(job: ExtractionJob) -> JobResult:
    """Extract (or reuse) the job's store; under torchrun, every process calls this.

    The processes only wait for each other and exchange small objects, so they
    talk over gloo even when they extract on GPUs.
    """
    with join("cpu") as ranks:
        return _run_job(replace(job, progress=job.progress and ranks.main), ranks)


def _run_job(job: ExtractionJob, ranks: Ranks) -> JobResult:
    what = job.extraction
    dataset = load_karpathy(job.dataset_json, images_inside_root=not job.images_outside_root)
    root = features_root(job.root)
    images = None
    if ranks.main:  # one process reads (and caches) the image hashes
        with HashCache(root / ".hashes.sqlite") as hashes:
            images = images_digest(dataset, job.image_root, hashes)
    images = ranks.broadcast(images)
    settings = {"kind": what.kind, "backbone": what.backbone, "dtype": what.dtype,
                "images": images, **what.settings}
    fp = fingerprint(settings)
    path = store_path(f"{what.kind}-{what.backbone}", fp, out=job.out, root=root,
                      format=job.format)
    meta = {**what.schema.to_meta(),
            "producer": {"name": what.settings["extractor"], "settings": settings,
                         "about": what.describe},
            "fingerprint": fp, "capstack_version": pipeline.__version__,
            "dataset": str(Path(job.dataset_json).resolve()),
            "image_root": str(Path(job.image_root).resolve()),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if path.exists():
        result = JobResult(check_reusable(path, fp), fp, reused=True)
    elif ranks.distributed:
        result = _extract_sharded(job, dataset, path, meta, ranks)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        with exclusive_beside(path, f"extraction into {path}"):
            items = karpathy_items(dataset.images, job.image_root)
            result = _extract(job, items, path, meta)
    if ranks.main:
        publish(path, fp, job.pointer)
    return result


def _extract_sharded(job: ExtractionJob, dataset, path: Path, meta: dict,
                     ranks: Ranks) -> JobResult:
    """This rank's shard, then (rank 0) the merge; every rank returns the merged store."""
    items = karpathy_items(dataset.images, job.image_root)
    shard = shard_path(path, ranks.rank, ranks.world)
    path.parent.mkdir(parents=True, exist_ok=True)
    check_shards_fit(path, ranks.world)
    ranks.barrier()  # no rank starts a shard before every rank has checked
    mine = JobResult(shard, meta["fingerprint"], reused=True)
    with exclusive_beside(shard, f"extraction into {shard}"):
        if not shard.exists():
            shard_meta = {**meta, "shard": f"{ranks.rank} of {ranks.world}"}
            mine = _extract(job, shard_items(items, ranks.rank, ranks.world), shard, shard_meta)
    reports = ranks.gather((mine.extracted, mine.skipped, mine.seconds))
    if ranks.main:
        with exclusive_beside(path, f"extraction into {path}"):
            merge_shards(path, meta, [i for i, _ in items], ranks.world, job.format, job.progress)
    ranks.barrier()  # the store is complete before any rank returns it
    return JobResult(path, meta["fingerprint"], reused=False,
                     extracted=sum(r[0] for r in reports), skipped=sum(r[1] for r in reports),
                     seconds=max(r[2] for r in reports), shards=ranks.world)


def _extract(job: ExtractionJob, items, path: Path, meta: dict) -> JobResult:
    what = job.extraction
    writer = create_writer(path, meta, job.format)
    try:
        model = what.make_model() if any(i not in writer.done for i, _ in items) else None
        report = run_extraction(items, writer, model, what.transform,
                                batch_size=job.batch_size, workers=job.workers,
                                progress=job.progress, pin_memory=what.pin_memory,
                                write_ahead=job.write_ahead, decoder=what.decoder)
        writer.finish()
    finally:
        writer.close()
    return JobResult(path, meta["fingerprint"], reused=False, extracted=report.extracted,
                     skipped=len(writer.skipped), seconds=report.seconds)
