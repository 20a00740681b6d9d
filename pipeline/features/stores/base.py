"""The feature store contract: records by image id, self-describing metadata.

Every trainer input comes from a store, so a store must say what it holds and
never be half-written. A store is written under ``<path>.partial`` and renamed
to ``<path>`` by :meth:`StoreWriter.finish`; readers refuse a partial store,
one without metadata, or one whose record count disagrees with its metadata.

What a record holds is declared by the metadata's ``fields`` (schema.py): a
store reads and writes whatever fields are declared and knows nothing of the
extractor or importer that produced them (``producer``). Metadata also holds
``fingerprint`` (pipeline/features/fingerprint.py), ``count``, ``skipped``
(image id -> reason) and ``capstack_version``.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from pipeline.core.errors import CapstackError
from pipeline.features.stores.schema import FORMAT, Record, Schema, check_meta, check_record

PARTIAL_SUFFIX = ".partial"


def partial_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + PARTIAL_SUFFIX)


class StoreWriter(ABC):
    """Appends records to ``<path>.partial``; each :meth:`write` is one atomic commit.

    Opening a writer on an existing partial store resumes it: :attr:`done` holds
    the image ids already written or skipped, and nothing is written twice.
    A writer that streams its input (an import) commits with each batch a small
    JSON ``progress`` note (where it stopped in its sources), which a resuming
    writer finds in :attr:`progress`: the note and the records it covers are
    kept or lost together.
    """

    def __init__(self, path: str | os.PathLike, meta: dict):
        self.path = Path(path)
        self.partial = partial_path(self.path)
        self.meta = check_meta({"format": FORMAT, **meta}, str(self.path))
        self.schema = Schema.from_meta(self.meta, str(self.path))
        self.done: set[int] = set()
        self.skipped: dict[int, str] = {}
        self.progress: dict | None = None

    def write(self, records: Sequence[tuple[int, Record]],
              skipped: Iterable[tuple[int, str]] = (), progress: dict | None = None) -> None:
        """Commit a batch of records, skipped images and the progress note at once
        (an image already written, or twice in the batch, is written once)."""
        fresh: set[int] = set()  # not a copy of self.done: that grew the cost of a commit
        checked, fresh_skips = [], []  # with the store (123k images: 7,700 commits of 16)

        def first_time(image_id: int) -> bool:
            if image_id in self.done or image_id in fresh:
                return False
            fresh.add(image_id)
            return True

        for i, r in records:
            if first_time(int(i)):
                checked.append((int(i), check_record(self.schema, int(i), r, str(self.path))))
        for i, reason in skipped:
            if first_time(int(i)):
                fresh_skips.append((int(i), str(reason)))
        if not checked and not fresh_skips and progress is None:
            return
        with self.refusals_named():
            self._commit(checked, fresh_skips, progress)
        self.done.update(i for i, _ in checked)
        self.done.update(i for i, _ in fresh_skips)
        self.skipped.update(fresh_skips)
        if progress is not None:
            self.progress = progress

    def finish(self) -> Path:
        """Write the final metadata and rename the partial store into place."""
        self.meta["count"] = len(self.done) - len(self.skipped)
        self.meta["skipped"] = {str(k): v for k, v in sorted(self.skipped.items())}
        with self.refusals_named():
            self._write_final_meta()
        self.close()
        if self.path.exists():
            raise CapstackError(f"{self.path}: a complete store already exists here; "
                                f"the new one stays at {self.partial}")
        os.replace(self.partial, self.path)
        return self.path

    #: What the backend raises when the disk refuses a write (full, read-only, denied).
    write_errors: tuple[type[BaseException], ...] = (OSError,)

    @contextmanager
    def refusals_named(self):
        """A refused write as ``PARTIAL: cannot write it (why)``. A commit is atomic, so the
        records committed before it stay, and the next run resumes from them."""
        try:
            yield
        except self.write_errors as error:
            reason = getattr(error, "strerror", None) or str(error)
            raise CapstackError(
                f"{self.partial}: cannot write it ({reason}); the {len(self.done)} records "
                f"committed before are kept: make room, then run again to resume") from None

    @abstractmethod
    def _commit(self, records: list[tuple[int, Record]], skipped: list[tuple[int, str]],
                progress: dict | None) -> None: ...

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
    fields: dict[str, np.ndarray] = field(default_factory=dict)  # others asked for: [B, Nmax, ...]


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
        self.schema = Schema.from_meta(self.meta, str(self.path))
        self.feature_dim = self.schema.feature_dim
        self.dtype = self.schema.dtype
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
                   allocate=np.empty, fields: Sequence[str] = ()) -> Batch:
        """Records of ``image_ids`` in one padded batch (the store's dtypes, no conversion),
        with the declared ``fields`` besides the features.

        ``allocate(shape, dtype)`` makes the feature array (e.g. in shared memory)."""
        records = [self.get(i) for i in image_ids]
        rows = max(r.num for r in records) if records else 0
        rows = min(rows, max_rows) if max_rows else rows
        features = allocate((len(records), rows, self.feature_dim), self.dtype)
        features[...] = 0
        batch = Batch(features, np.zeros((len(records), rows), dtype=bool),
                      np.zeros((len(records), 2), dtype=np.int32), self._padded(fields, rows,
                                                                                len(records)))
        for k, r in enumerate(records):
            n = min(r.num, rows)
            features[k, :n] = r.features[:n]
            batch.mask[k, :n] = True
            batch.hw[k] = (r.height, r.width)
            for name, array in batch.fields.items():
                array[k, :n] = r[name][:n]
        return batch

    def _padded(self, names: Sequence[str], rows: int, b: int) -> dict[str, np.ndarray]:
        """Zeroed [b, rows, ...] arrays of the fields ``names``, refused when not declared."""
        out = {}
        for name in names:
            if not self.schema.has(name) or name == "features":
                raise CapstackError(f"{self.path}: no field {name!r} to read besides the features "
                                    f"(fields: {', '.join(self.schema.names)})")
            f = self.schema.get(name)
            out[name] = np.zeros((b, rows, *f.shape), f.dtype)
        return out

    def _read_meta(self) -> dict:
        raw = self._raw_meta()
        if raw is None:
            raise CapstackError(f"{self.path}: not a capstack feature store (no metadata)")
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            raise CapstackError(f"{self.path}: store metadata is not valid JSON") from None

    @abstractmethod
    def _raw_meta(self) -> str | bytes | None:
        """The metadata JSON as stored, or None when there is none."""

    @abstractmethod
    def _read_ids(self) -> np.ndarray: ...

    @abstractmethod
    def _get(self, image_id: int) -> Record: ...

    def close(self) -> None:  # noqa: B027 - a backend with nothing to release keeps it
        """Release the backend handle (reopened lazily on the next read)."""

    def __getstate__(self):
        state = self.__dict__.copy()
        for key in [k for k in state if k.startswith("_handle")]:
            state[key] = None
        return state
