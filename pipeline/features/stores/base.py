"""The feature store contract: records by image id, self-describing metadata.

Every trainer input comes from a store, so a store must say what it holds and
never be half-written. A store is written under ``<path>.partial`` and renamed
to ``<path>`` by :meth:`StoreWriter.finish`; readers refuse a partial store,
one without metadata, or one whose record count disagrees with its metadata.

A record is one image's features: ``features`` [N, D] (grid: N = grid x grid
cells in row-major order; regions: N boxes), the image's ``height`` and
``width``, and for region stores ``boxes`` [N, 4] (image pixels x1, y1, x2,
y2), ``scores`` [N] and ``classes`` [N].

Metadata (a JSON object) records what made the features: ``kind`` (grid or
regions), ``extractor``, ``backbone``, ``weights`` and ``weights_md5`` (or
"random"), ``image_size``, ``grid`` or box settings, ``layer``,
``feature_dim``, ``dtype``, ``count``, ``skipped`` (image id -> reason),
``capstack_version`` and ``fingerprint`` (see :mod:`pipeline.features.fingerprint`).
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from pipeline.core.errors import CapstackError

KINDS = ("grid", "regions")
DTYPES = ("float16", "float32")
PARTIAL_SUFFIX = ".partial"
REQUIRED_META = ("kind", "extractor", "backbone", "weights", "weights_md5", "feature_dim",
                 "dtype", "fingerprint", "capstack_version")


@dataclass
class Record:
    features: np.ndarray  # [N, D]
    height: int
    width: int
    boxes: np.ndarray | None = None  # [N, 4] float32, regions only
    scores: np.ndarray | None = None  # [N] float32, regions only
    classes: np.ndarray | None = None  # [N] int32, regions only

    @property
    def num(self) -> int:
        return int(self.features.shape[0])


def partial_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + PARTIAL_SUFFIX)


def check_meta(meta: dict, where: str) -> dict:
    """Refuse metadata that lacks a field or names an unknown kind or dtype."""
    if not isinstance(meta, dict):
        raise CapstackError(f"{where}: store metadata is not an object")
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise CapstackError(f"{where}: store metadata lacks {', '.join(missing)}")
    if meta["kind"] not in KINDS:
        raise CapstackError(f"{where}: store metadata kind {meta['kind']!r} is not one of "
                            f"{', '.join(KINDS)}")
    if meta["dtype"] not in DTYPES:
        raise CapstackError(f"{where}: store metadata dtype {meta['dtype']!r} is not one of "
                            f"{', '.join(DTYPES)}")
    return meta


def check_record(meta: dict, image_id: int, record: Record, where: str) -> Record:
    """The record cast to the store's dtype, or a CapstackError naming the image."""
    features = np.asarray(record.features)
    if features.ndim != 2 or features.shape[1] != meta["feature_dim"]:
        raise CapstackError(f"{where}: image {image_id}: features of shape {features.shape}, "
                            f"expected [N, {meta['feature_dim']}]")
    if meta["kind"] == "grid" and meta.get("grid") and features.shape[0] != meta["grid"] ** 2:
        raise CapstackError(f"{where}: image {image_id}: {features.shape[0]} grid cells, "
                            f"expected {meta['grid']}x{meta['grid']}")
    with np.errstate(over="ignore", invalid="ignore"):
        cast = features.astype(meta["dtype"], copy=False)
    if not np.isfinite(cast).all():
        peak = float(np.nanmax(np.abs(features.astype(np.float64))))
        raise CapstackError(
            f"{where}: image {image_id}: non-finite feature values (largest magnitude {peak:.3g}"
            f"{' overflows float16' if meta['dtype'] == 'float16' and peak > 65504 else ''}); "
            f"refusing to write them. Random deep networks produce such values: use trained "
            f"weights, or --dtype float32 when the magnitudes are genuine")
    n = features.shape[0]
    out = Record(cast, int(record.height), int(record.width))
    if meta["kind"] == "regions":
        out.boxes = _shaped(record.boxes, (n, 4), np.float32, "boxes", image_id, where)
        out.scores = _shaped(record.scores, (n,), np.float32, "scores", image_id, where)
        out.classes = _shaped(record.classes, (n,), np.int32, "classes", image_id, where)
    return out


def _shaped(value, shape, dtype, name, image_id, where):
    if value is None:
        raise CapstackError(f"{where}: image {image_id}: region record without {name}")
    array = np.asarray(value, dtype=dtype)
    if array.shape != shape:
        raise CapstackError(f"{where}: image {image_id}: {name} of shape {array.shape}, "
                            f"expected {list(shape)}")
    return array


class StoreWriter(ABC):
    """Appends records to ``<path>.partial``; each :meth:`write` is one atomic commit.

    Opening a writer on an existing partial store resumes it: :attr:`done` holds
    the image ids already written or skipped, and nothing is written twice.
    """

    def __init__(self, path: str | os.PathLike, meta: dict):
        self.path = Path(path)
        self.partial = partial_path(self.path)
        self.meta = check_meta(dict(meta), str(self.path))
        self.done: set[int] = set()
        self.skipped: dict[int, str] = {}

    def write(self, records: Sequence[tuple[int, Record]],
              skipped: Iterable[tuple[int, str]] = ()) -> None:
        """Commit a batch of records and skipped images at once."""
        checked = [(int(i), check_record(self.meta, int(i), r, str(self.path)))
                   for i, r in records]
        fresh_skips = [(int(i), str(reason)) for i, reason in skipped if int(i) not in self.done]
        checked = [(i, r) for i, r in checked if i not in self.done]
        if not checked and not fresh_skips:
            return
        self._commit(checked, fresh_skips)
        self.done.update(i for i, _ in checked)
        self.done.update(i for i, _ in fresh_skips)
        self.skipped.update(fresh_skips)

    def finish(self) -> Path:
        """Write the final metadata and rename the partial store into place."""
        self.meta["count"] = len(self.done) - len(self.skipped)
        self.meta["skipped"] = {str(k): v for k, v in sorted(self.skipped.items())}
        self._write_final_meta()
        self.close()
        if self.path.exists():
            raise CapstackError(f"{self.path}: a complete store already exists here; "
                                f"the new one stays at {self.partial}")
        os.replace(self.partial, self.path)
        return self.path

    @abstractmethod
    def _commit(self, records: list[tuple[int, Record]], skipped: list[tuple[int, str]]): ...

    @abstractmethod
    def _write_final_meta(self) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass
class Batch:
    """Records of several images, padded to the longest: what a training batch needs."""

    features: np.ndarray  # [B, Nmax, D], the store's dtype
    mask: np.ndarray  # [B, Nmax] bool, True where a row is real
    hw: np.ndarray  # [B, 2] int32 (height, width)
    boxes: np.ndarray | None = None  # [B, Nmax, 4] float32, regions only


class StoreReader(ABC):
    """Random access by image id. Safe to pickle into DataLoader workers:
    the backend is opened lazily, once per process, read-only."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if self.path.name.endswith(PARTIAL_SUFFIX) or (
                not self.path.exists() and partial_path(self.path).exists()):
            raise CapstackError(f"{self.path}: store is still being written (or its writer "
                                f"was stopped); rerun the extraction to complete it")
        if not self.path.exists():
            raise CapstackError(f"{self.path}: feature store not found")
        self.meta = check_meta(self._read_meta(), str(self.path))
        self.kind = self.meta["kind"]
        self.feature_dim = int(self.meta["feature_dim"])
        self.dtype = np.dtype(self.meta["dtype"])
        self._ids = self._read_ids()
        if len(self._ids) != self.meta.get("count"):
            raise CapstackError(f"{self.path}: metadata says {self.meta.get('count')} records, "
                                f"the store holds {len(self._ids)}")
        self._index = {int(i): k for k, i in enumerate(self._ids)}

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, image_id) -> bool:
        return int(image_id) in self._index

    def ids(self) -> np.ndarray:
        return self._ids.copy()

    def missing(self, image_ids: Iterable[int]) -> list[int]:
        return [int(i) for i in image_ids if int(i) not in self._index]

    def get(self, image_id: int) -> Record:
        if int(image_id) not in self._index:
            raise KeyError(f"{self.path}: no record for image {image_id}")
        return self._get(int(image_id))

    def read_batch(self, image_ids: Sequence[int], max_rows: int | None = None,
                   allocate=np.empty) -> Batch:
        """Records of ``image_ids`` in one padded batch (the store's dtype, no conversion).

        ``allocate(shape, dtype)`` makes the feature array (e.g. in shared memory)."""
        records = [self.get(i) for i in image_ids]
        rows = max(r.num for r in records) if records else 0
        rows = min(rows, max_rows) if max_rows else rows
        b = len(records)
        features = allocate((b, rows, self.feature_dim), self.dtype)
        features[...] = 0
        mask = np.zeros((b, rows), dtype=bool)
        hw = np.zeros((b, 2), dtype=np.int32)
        boxes = np.zeros((b, rows, 4), dtype=np.float32) if self.kind == "regions" else None
        for k, r in enumerate(records):
            n = min(r.num, rows)
            features[k, :n] = r.features[:n]
            mask[k, :n] = True
            hw[k] = (r.height, r.width)
            if boxes is not None:
                boxes[k, :n] = r.boxes[:n]
        return Batch(features, mask, hw, boxes)

    def _read_meta(self) -> dict:
        raw = self._raw_meta()
        if raw is None:
            raise CapstackError(f"{self.path}: not a capstack feature store (no metadata)")
        try:
            return json.loads(raw)
        except ValueError:
            raise CapstackError(f"{self.path}: store metadata is not valid JSON") from None

    @abstractmethod
    def _raw_meta(self) -> str | bytes | None:
        """The metadata JSON as stored, or None when there is none."""

    @abstractmethod
    def _read_ids(self) -> np.ndarray: ...

    @abstractmethod
    def _get(self, image_id: int) -> Record: ...

    def close(self) -> None:
        """Release the backend handle (reopened lazily on the next read)."""

    def __getstate__(self):
        state = self.__dict__.copy()
        for key in [k for k in state if k.startswith("_handle")]:
            state[key] = None
        return state
