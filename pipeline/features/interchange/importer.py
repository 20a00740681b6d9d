"""``capstack import-features``: another toolkit's features -> a checked, self-describing store.

The sources are hashed first (content md5, remembered while a file's size and
mtime hold), and the store is named ``<kind>-<format>-<fingerprint>`` from that
content and the import settings, so importing the same files again, from any
stages file, finds the store and reads nothing. Then each source is streamed
once, in constant memory: rows are matched to the dataset's images, checked,
and committed batch by batch together with the position reached, which is
where a killed import resumes (nothing lost, nothing written twice).

What does not import is recorded, never fatal: a broken row (base64 that does
not decode, a ``num_boxes`` the arrays disagree with, non-finite values, a
feature width unlike the other rows') goes into the store's ``skipped`` under
its image with file, line or key and reason; duplicated images keep their
first row; rows of images outside the dataset are counted and not decoded;
dataset images no source has are skipped as such. A source unreadable as a
whole stops the import, naming the file, before anything is written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import pipeline
from pipeline.captions.karpathy import load_karpathy
from pipeline.core.errors import CapstackError
from pipeline.core.hashing import HashCache
from pipeline.core.interrupt import stop_at_batch_boundary
from pipeline.core.runlock import exclusive_beside
from pipeline.features.fingerprint import fingerprint
from pipeline.features.interchange.formats import FORMATS
from pipeline.features.interchange.formats.base import BadRow, FeatureFormat, read_row, unreadable
from pipeline.features.interchange.ids import ImageMatcher, dataset_digest
from pipeline.features.interchange.report import ImportReport
from pipeline.features.interchange.sizes import ImageSizes
from pipeline.features.placement import check_reusable, features_root, publish, store_path
from pipeline.features.stores import Record, Schema, create_writer
from pipeline.features.stores import field as store_field
from pipeline.features.stores import remove_store
from pipeline.features.stores.schema import representable

IMPORT_VERSION = 1  # bump when the same sources and settings start giving other records
HASH_THREADS = 2
PROBE_ROWS = 50  # rows of a unit tried before calling it unreadable as a whole
PIXEL_BOXES = "x1, y1, x2, y2 in image pixels"
MAX_IMAGE_SIDE = 1 << 20  # pixels: beyond any camera or scan (PIL refuses far smaller images)
INT32 = np.iinfo(np.int32)


@dataclass
class ImportJob:
    format: str
    sources: list[Path]
    dataset_json: Path
    dtype: str = "float16"
    match: str = "auto"
    image_root: Path | None = None  # image sizes for formats that do not record them
    describe: dict = field(default_factory=dict)  # --describe KEY=VALUE: about the producer
    out: Path | None = None
    root: Path | None = None
    store_format: str | None = None
    commit_bytes: int = 64 << 20  # source bytes per commit: at most what a kill loses


@dataclass
class ImportResult:
    store: Path
    fingerprint: str
    reused: bool
    report: ImportReport | None = None
    seconds: float = 0.0
    nbytes: int = 0

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / 2**20 / self.seconds if self.seconds else 0.0


def import_features(job: ImportJob, *, pointer: Path | None = None,
                    progress: bool = True) -> ImportResult:
    """Import (or reuse) the store of ``job``'s sources; publish it under ``pointer``."""
    fmt: FeatureFormat = FORMATS.get(job.format)()
    dataset = load_karpathy(job.dataset_json)
    units = [unit.resolve() for unit in fmt.units([Path(p).expanduser() for p in job.sources])]
    if fmt.relative_boxes and job.image_root is None:
        raise CapstackError(f"{job.format}: its boxes are fractions of the image and it records "
                            f"no image sizes: pass --image-root (the dataset's images) so the "
                            f"boxes can be stored in pixels")
    root = features_root(job.root)
    sources = _hash_sources(fmt, units, root, progress)
    schema = _probe(fmt, units, job.dtype)
    settings = {"importer": "import-features", "version": IMPORT_VERSION, "format": job.format,
                "sources": [s["md5"] for s in sources], "dtype": job.dtype, "match": job.match,
                "dataset": dataset_digest(dataset),
                "image_sizes": "images" if job.image_root else "source"}
    fp = fingerprint(settings)
    kind = "grid" if schema.grid else "regions"
    path = store_path(f"{kind}-{job.format}", fp, out=job.out, root=root,
                      format=job.store_format)
    if path.exists():
        result = ImportResult(check_reusable(path, fp), fp, reused=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = _meta(job, fmt, units, sources, schema, settings, fp, dataset)
        with exclusive_beside(path, f"import into {path}"):
            total = sum(source["size"] for source in sources)
            result = _import(fmt, units, path, meta, job, dataset, total, progress)
    publish(path, fp, pointer)
    return result


# ----------------------------------------------------------------------------- before

def _hash_sources(fmt: FeatureFormat, units: list[Path], root: Path, progress: bool) -> list[dict]:
    """Provenance of each file or folder the records come from: path, size, content md5.

    Parts are hashed two at a time (hashlib lets go of the GIL on large reads),
    which halves the first import's hashing of a multi-part TSV on two cores."""
    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    content = [p for unit in units for p in fmt.content(unit)]
    total = sum(fmt.size(unit) for unit in units)
    with HashCache(root / ".hashes.sqlite") as hashes, \
            tqdm(total=total, desc="hash sources", unit="B", unit_scale=True,
                 disable=not progress) as bar, ThreadPoolExecutor(HASH_THREADS) as pool:
        return list(pool.map(lambda path: _provenance(path, hashes, bar.update), content))


def _provenance(path: Path, hashes: HashCache, update) -> dict:
    try:
        digest = hashes.digest(path, progress=update)
    except OSError as error:
        raise CapstackError(f"{path}: cannot read ({error.strerror})") from None
    if digest is None:  # gone, or neither a regular file nor a folder (never read)
        raise CapstackError(f"{path}: not a regular file or a folder of them")
    entry = {"path": str(path.resolve()), "size": digest.size, "md5": digest.md5}
    return entry | ({"files": digest.nfiles} if path.is_dir() else {})


def _probe(fmt: FeatureFormat, units: list[Path], dtype: str) -> Schema:
    """The schema of the first readable row; every unit must hold readable rows like it."""
    schema = None
    for unit in units:
        record = _first_record(fmt, unit)
        found = schema_of(record, dtype, fmt.grid)
        if schema is None:
            schema = found
        elif found != schema:
            raise CapstackError(f"{unit}: holds {found.describe()} records, {units[0]} holds "
                                f"{schema.describe()}: they cannot form one store")
    if schema is None:
        raise CapstackError("no sources given")
    return schema


def _first_record(fmt: FeatureFormat, unit: Path) -> Record:
    problems = []
    for k, step in enumerate(fmt.steps(unit, 0)):
        if k == PROBE_ROWS:
            break
        try:
            return plausible(read_row(step.row))
        except BadRow as error:
            problems.append(f"{step.row.where}: {error}")
    if not problems:
        raise CapstackError(f"{unit}: no rows ({fmt.name})")
    raise CapstackError(f"{unit}: not readable as {fmt.name}: its first {len(problems)} rows "
                        f"fail ({problems[0]})")


def schema_of(record: Record, dtype: str, grid: int | None) -> Schema:
    """Features in ``dtype``; every other field the source has, as float32 or int32."""
    fields = [store_field("features", record.features.shape[1:], dtype)]
    for name, array in record.fields.items():
        if name != "features":
            kind = np.float32 if np.issubdtype(array.dtype, np.floating) else np.int32
            fields.append(store_field(name, array.shape[1:], kind))
    return Schema(tuple(fields), grid)


def _meta(job: ImportJob, fmt: FeatureFormat, units, sources, schema: Schema, settings, fp,
          dataset) -> dict:
    about = {"format": job.format, "sources": sources, "fields": list(schema.names),
             "boxes_converted_from": fmt.boxes if schema.has("boxes") else None,
             "boxes": PIXEL_BOXES if schema.has("boxes") else None,
             "image_sizes": (f"read from the images under {Path(job.image_root).resolve()}"
                             if job.image_root else "as the source records them"),
             "source_producer": fmt.producer(units), "described": dict(job.describe)}
    return {**schema.to_meta(),
            "producer": {"name": "import-features", "settings": settings, "about": about},
            "fingerprint": fp, "capstack_version": pipeline.__version__,
            "dataset": str(Path(job.dataset_json).resolve()),
            "image_root": str(Path(job.image_root).resolve()) if job.image_root else "",
            "image_size_known": bool(job.image_root) or fmt.records_sizes,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}


# ----------------------------------------------------------------------------- the stream

class _Batch:
    def __init__(self) -> None:
        self.records: list[tuple[int, Record]] = []
        self.skipped: list[tuple[int, str]] = []
        self.ids: set[int] = set()
        self.nbytes = 0


def _import(fmt, units, path, meta, job: ImportJob, dataset, total: int,
            progress: bool) -> ImportResult:
    from tqdm import tqdm

    writer = create_writer(path, meta, job.store_format)
    report = ImportReport.from_note(writer.progress)
    match = ImageMatcher(dataset, job.match)
    sizes = ImageSizes(dataset, job.image_root) if job.image_root else None
    started, read_before = time.perf_counter(), report.nbytes
    try:
        with stop_at_batch_boundary() as stop, \
                tqdm(total=total, initial=report.nbytes, desc=f"import {fmt.name}", unit="B",
                     unit_scale=True, disable=not progress) as bar:
            batch = _Batch()
            for k in range(report.unit, len(units)):
                start = report.position if k == report.unit else 0
                for step in fmt.steps(units[k], start):
                    _take(step.row, writer, batch, report, match, sizes, fmt, writer.schema)
                    report.advance(k, step.position, step.nbytes)
                    batch.nbytes += step.nbytes
                    bar.update(step.nbytes)
                    if batch.nbytes >= job.commit_bytes:
                        _commit(writer, batch, report)
                        batch = _Batch()
                        bar.set_postfix(records=report.imported, refresh=False)
                        if stop["stop"]:
                            raise CapstackError(
                                f"interrupted: {report.imported} records are in "
                                f"{writer.partial}; run the same command again to resume")
            _commit(writer, batch, report)
        _finish(writer, report, dataset, fmt, units)
    finally:
        writer.close()
    return ImportResult(path, meta["fingerprint"], reused=False, report=report,
                        seconds=time.perf_counter() - started, nbytes=report.nbytes - read_before)


def _take(row, writer, batch: _Batch, report: ImportReport, match, sizes, fmt, schema) -> None:
    """One source row into the batch (or the report)."""
    if row.key is None:
        report.unidentified(row.where, row.problem)
        return
    image_id = match(row.key)
    if image_id is None:
        report.outside_dataset += 1
        return
    if image_id in writer.done or image_id in batch.ids:
        report.duplicate(image_id, row.where)
        return
    batch.ids.add(image_id)
    try:
        record = checked(read_row(row), schema)
        if sizes and (not record.height or not record.width):
            record.height, record.width = sizes(image_id)
        if fmt.relative_boxes and record.get("boxes") is not None:
            record.fields["boxes"] = to_pixels(record["boxes"], record.height, record.width)
    except BadRow as error:
        _skip(batch, report, image_id, row.where, str(error))
        return
    except Exception as error:  # noqa: BLE001 - a row that breaks a check is that row's
        _skip(batch, report, image_id, row.where, unreadable(error))
        return
    batch.records.append((image_id, record))
    report.imported += 1


def _skip(batch: _Batch, report: ImportReport, image_id: int, where: str, reason: str) -> None:
    batch.skipped.append((image_id, f"{where}: {reason}"))
    report.bad(image_id, where, reason)


def plausible(record: Record) -> Record:
    """``record`` when it can be a record of any store: at least one region (an image with
    none has nothing to caption from: a bad row, as extraction skips it), numbers in every
    field (real ones: a complex value would lose its imaginary part), integer fields within
    int32 (a class id 2**40 would wrap to 0), and image sides from 0 (unknown) to
    :data:`MAX_IMAGE_SIDE`; else :class:`BadRow`."""
    features = record.features
    if not isinstance(features, np.ndarray) or features.ndim != 2:
        shape = list(getattr(features, "shape", ())) or type(features).__name__
        raise BadRow(f"features of shape {shape}, expected [N, D]")
    if record.num == 0:
        raise BadRow("no regions (0 feature rows): nothing to caption from")
    if features.shape[1] == 0:
        raise BadRow("features of 0 columns")
    for name, array in record.fields.items():
        if not isinstance(array, np.ndarray):
            raise BadRow(f"{name}: a {type(array).__name__}, not an array")
        if array.dtype.kind == "c":
            raise BadRow(f"{name}: complex values (features are real numbers)")
        if array.dtype.kind not in "biuf":
            raise BadRow(f"{name}: values of dtype {array.dtype} are not numbers")
        if array.dtype.kind in "iu" and array.size:
            low, high = int(array.min()), int(array.max())
            if low < INT32.min or high > INT32.max:
                beyond = high if high > INT32.max else low
                raise BadRow(f"{name}: {beyond} is beyond the int32 range the store keeps")
    for side, value in (("image height", record.height), ("image width", record.width)):
        if not 0 <= value <= MAX_IMAGE_SIDE:
            raise BadRow(f"{side} {value}: expected 0 (unknown) to {MAX_IMAGE_SIDE} pixels")
    return record

def checked(record: Record, schema: Schema) -> Record:
    """``record`` when it is :func:`plausible` and fits ``schema`` with representable values;
    else :class:`BadRow`."""
    plausible(record)
    names = tuple(record.fields)
    if sorted(names) != sorted(schema.names):
        raise BadRow(f"fields {', '.join(names)}, the other rows have {', '.join(schema.names)}")
    n = record.num
    if record.features.shape[1:] != schema.features.shape:
        raise BadRow(f"features {record.features.shape[1] if record.features.ndim == 2 else '?'}"
                     f"-d, the other rows' are {schema.feature_dim}-d")
    if schema.grid and n != schema.grid ** 2:
        raise BadRow(f"{n} grid cells, the other rows' are {schema.grid}x{schema.grid}")
    for f in schema.fields:
        array = record[f.name]
        if array.shape != (n, *f.shape):
            raise BadRow(f"{f.name} of shape {list(array.shape)}, expected {[n, *f.shape]}")
        if np.issubdtype(array.dtype, np.floating):
            kind = f.dtype if f.name == "features" else np.float32
            if not representable(array, kind):
                beyond = "" if kind != np.float16 else " or beyond float16's range (" \
                    "--dtype float32 keeps such values)"
                raise BadRow(f"{f.name}: non-finite values{beyond}")
    return record


def to_pixels(boxes: np.ndarray, height: int, width: int) -> np.ndarray:
    """Boxes as fractions of the image -> x1, y1, x2, y2 in pixels."""
    if not height or not width:
        raise BadRow("boxes are fractions of an image whose size is unknown")
    return (boxes * np.array([width, height, width, height], np.float32)).astype(np.float32)


def _commit(writer, batch: _Batch, report: ImportReport) -> None:
    writer.write(batch.records, batch.skipped, progress=report.to_note())


def _finish(writer, report: ImportReport, dataset, fmt: FeatureFormat, units) -> None:
    if not writer.done - set(writer.skipped):
        writer.close()
        remove_store(writer.path)
        raise CapstackError(
            f"{units[0]}: no row matched an image of {dataset.path} ({report.outside_dataset} "
            f"rows name other images, {report.bad_rows} are broken): is it this dataset's "
            f"features? (--match stem|id chooses how rows name images)")
    missing = [im.image_id for im in dataset.images if im.image_id not in writer.done]
    report.missing = len(missing)
    report.first_missing = missing[:20]
    writer.write([], [(i, f"no features for it in the {fmt.name} sources") for i in missing])
    writer.meta["import"] = report.summary()
    writer.finish()
