"""One extraction from settings to a complete, shared, named store.

A store's name is ``<kind>-<backbone>-<fingerprint>`` under the shared root
(``--features-root``, else ``$CAPSTACK_FEATURES``, else
``~/.cache/capstack/features``), unless ``--out`` names it. When a complete
store with that fingerprint exists, extraction is skipped and the store is
reused. ``--pointer FILE`` writes a small json naming the store, which is what
a stage declares as its out (the store itself is shared, outside any workdir).
Each store keeps beside it ``<name>.users.json``: the pointers and stages that
used it, for ``capstack stores``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pipeline
from pipeline.atomic import atomic_file
from pipeline.errors import CapstackError
from pipeline.extract.runner import BatchModel, run_extraction
from pipeline.fingerprint import fingerprint, images_digest
from pipeline.hashing import HashCache
from pipeline.karpathy import load_karpathy
from pipeline.runlock import exclusive_run
from pipeline.stores.pointer import write_pointer
from pipeline.stores import create_writer, open_store, store_format

SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5"}


def features_root(explicit: str | Path | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("CAPSTACK_FEATURES")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "capstack" / "features"


@dataclass
class ExtractionJob:
    kind: str  # grid | regions
    backbone: str
    dataset_json: Path
    image_root: Path
    settings: dict  # everything else that determines the features (fingerprinted)
    describe: dict  # metadata that does not change the features (layer text, weights path)
    dtype: str = "float16"
    out: Path | None = None
    root: Path | None = None
    format: str | None = None


@dataclass
class JobResult:
    store: Path
    fingerprint: str
    reused: bool
    extracted: int = 0
    skipped: int = 0
    images_per_s: float = 0.0


def run_job(job: ExtractionJob, make_model: Callable[[], BatchModel], transform, *,
            batch_size: int, workers: int, pointer: Path | None = None,
            progress: bool = True, pin_memory: bool = False) -> JobResult:
    dataset = load_karpathy(job.dataset_json)
    root = features_root(job.root)
    with HashCache(root / ".hashes.sqlite") as hashes:
        images = images_digest(dataset, job.image_root, hashes)
    settings = {"kind": job.kind, "backbone": job.backbone, "dtype": job.dtype,
                "images": images, **job.settings}
    fp = fingerprint(settings)
    path = _store_path(job, root, fp)
    meta = {"kind": job.kind, "backbone": job.backbone, "dtype": job.dtype, "fingerprint": fp,
            "capstack_version": pipeline.__version__,
            "dataset": str(Path(job.dataset_json).resolve()),
            "image_root": str(Path(job.image_root).resolve()), "settings": settings,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"), **job.settings, **job.describe}
    if path.exists():
        result = JobResult(_check_reusable(path, fp), fp, reused=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        with exclusive_run(path.with_name(path.name + ".lock"), f"extraction into {path}"):
            result = _extract(job, dataset, path, meta, make_model, transform, batch_size,
                              workers, progress, pin_memory)
    _record_user(path, pointer)
    if pointer:
        write_pointer(pointer, path, fp, job.kind)
    return result


def _store_path(job: ExtractionJob, root: Path, fp: str) -> Path:
    if job.out:
        store_format(job.out, job.format)  # refuse an unknown suffix before any work
        return Path(job.out)
    fmt = job.format or "lmdb"
    store_format(f"x{SUFFIX.get(fmt, '')}", fmt)
    return root / f"{job.kind}-{job.backbone}-{fp}{SUFFIX[fmt]}"


def _check_reusable(path: Path, fp: str) -> Path:
    store = open_store(path)
    if store.meta["fingerprint"] != fp:
        raise CapstackError(f"{path}: holds other features (fingerprint "
                            f"{store.meta['fingerprint']}, these settings give {fp}); delete it "
                            f"or choose another --out")
    store.close()
    return path


def _extract(job, dataset, path, meta, make_model, transform, batch_size, workers, progress,
             pin_memory) -> JobResult:
    items = [(im.image_id, job.image_root / im.relpath) for im in dataset.images]
    writer = create_writer(path, meta, job.format)
    try:
        model = make_model() if any(i not in writer.done for i, _ in items) else None
        report = run_extraction(items, writer, model, transform, batch_size=batch_size,
                                workers=workers, progress=progress, pin_memory=pin_memory)
        writer.finish()
    finally:
        writer.close()
    return JobResult(path, meta["fingerprint"], reused=False, extracted=report.extracted,
                     skipped=len(writer.skipped), images_per_s=report.images_per_s)


def _record_user(store: Path, pointer: Path | None) -> None:
    users_file = store.with_name(store.name + ".users.json")
    try:
        users = json.loads(users_file.read_text())
    except (OSError, ValueError):
        users = []
    entry = {"stage": os.environ.get("CAPSTACK_STAGE", ""),
             "pointer": str(Path(pointer).resolve()) if pointer else ""}
    if entry not in users:
        users.append(entry)
        with atomic_file(users_file) as tmp:
            tmp.write_text(json.dumps(users, indent=1))
