"""One extraction from settings to a complete, shared, named store.

The store is named ``<kind>-<backbone>-<fingerprint>`` (kind: grid or regions,
the extractor's word) and placed, reused and published as every store is
(pipeline/features/placement.py). Under torchrun each process extracts a shard
and rank 0 merges them into the one store (pipeline/features/extract/shards.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pipeline
from pipeline.captions.karpathy import load_karpathy
from pipeline.core.hashing import HashCache
from pipeline.core.ranks import Ranks, join
from pipeline.core.runlock import exclusive_beside
from pipeline.features.extract.images import karpathy_items
from pipeline.features.extract.runner import BatchModel, run_extraction
from pipeline.features.extract.shards import check_shards_fit, merge_shards, shard_items, shard_path
from pipeline.features.fingerprint import fingerprint, images_digest
from pipeline.features.placement import check_reusable, features_root, publish, store_path
from pipeline.features.stores import Schema, create_writer


@dataclass
class ExtractionJob:
    kind: str  # grid | regions: the store's name and the fingerprint say it
    backbone: str
    dataset_json: Path
    image_root: Path
    settings: dict  # everything else that determines the features (fingerprinted)
    describe: dict  # metadata that does not change the features (layer text, weights path)
    schema: Schema  # the fields of every record the extractor makes
    dtype: str = "float16"
    out: Path | None = None
    root: Path | None = None
    format: str | None = None
    images_outside_root: bool = False  # the user opted in to ../ and absolute image paths


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


def run_job(job: ExtractionJob, make_model: Callable[[], BatchModel], transform, *,
            batch_size: int, workers: int, pointer: Path | None = None,
            progress: bool = True, pin_memory: bool = False) -> JobResult:
    """Extract (or reuse) the job's store; under torchrun, every process calls this.

    The processes only wait for each other and exchange small objects, so they
    talk over gloo even when they extract on GPUs.
    """
    with join("cpu") as ranks:
        return _run_job(job, make_model, transform, batch_size, workers, pointer,
                        progress and ranks.main, pin_memory, ranks)


def _run_job(job, make_model, transform, batch_size, workers, pointer, progress, pin_memory,
             ranks: Ranks) -> JobResult:
    dataset = load_karpathy(job.dataset_json, images_inside_root=not job.images_outside_root)
    root = features_root(job.root)
    images = None
    if ranks.main:  # one process reads (and caches) the image hashes
        with HashCache(root / ".hashes.sqlite") as hashes:
            images = images_digest(dataset, job.image_root, hashes)
    images = ranks.broadcast(images)
    settings = {"kind": job.kind, "backbone": job.backbone, "dtype": job.dtype,
                "images": images, **job.settings}
    fp = fingerprint(settings)
    path = store_path(f"{job.kind}-{job.backbone}", fp, out=job.out, root=root,
                      format=job.format)
    meta = {**job.schema.to_meta(),
            "producer": {"name": job.settings["extractor"], "settings": settings,
                         "about": job.describe},
            "fingerprint": fp, "capstack_version": pipeline.__version__,
            "dataset": str(Path(job.dataset_json).resolve()),
            "image_root": str(Path(job.image_root).resolve()),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if path.exists():
        result = JobResult(check_reusable(path, fp), fp, reused=True)
    elif ranks.distributed:
        result = _extract_sharded(job, dataset, path, meta, make_model, transform, batch_size,
                                  workers, progress, pin_memory, ranks)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        with exclusive_beside(path, f"extraction into {path}"):
            items = karpathy_items(dataset.images, job.image_root)
            result = _extract(job, items, path, meta, make_model, transform, batch_size,
                              workers, progress, pin_memory)
    if ranks.main:
        publish(path, fp, pointer)
    return result


def _extract_sharded(job, dataset, path, meta, make_model, transform, batch_size, workers,
                     progress, pin_memory, ranks: Ranks) -> JobResult:
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
            mine = _extract(job, shard_items(items, ranks.rank, ranks.world), shard, shard_meta,
                            make_model, transform, batch_size, workers, progress, pin_memory)
    reports = ranks.gather((mine.extracted, mine.skipped, mine.seconds))
    if ranks.main:
        with exclusive_beside(path, f"extraction into {path}"):
            merge_shards(path, meta, [i for i, _ in items], ranks.world, job.format, progress)
    ranks.barrier()  # the store is complete before any rank returns it
    return JobResult(path, meta["fingerprint"], reused=False,
                     extracted=sum(r[0] for r in reports), skipped=sum(r[1] for r in reports),
                     seconds=max(r[2] for r in reports), shards=ranks.world)


def _extract(job, items, path, meta, make_model, transform, batch_size, workers, progress,
             pin_memory) -> JobResult:
    writer = create_writer(path, meta, job.format)
    try:
        model = make_model() if any(i not in writer.done for i, _ in items) else None
        report = run_extraction(items, writer, model, transform, batch_size=batch_size,
                                workers=workers, progress=progress, pin_memory=pin_memory)
        writer.finish()
    finally:
        writer.close()
    return JobResult(path, meta["fingerprint"], reused=False, extracted=report.extracted,
                     skipped=len(writer.skipped), seconds=report.seconds)
