"""HDF5 feature store: records as row ranges of shared, growable datasets.

Layout of the file (ending in ``.h5``):

* one dataset per declared field, rows of every record one after another:
  ``features`` [rows, D], and e.g. ``boxes`` [rows, 4], ``scores`` [rows];
* per record: ``image_ids`` int64, ``row_start`` int64, ``row_count`` int32,
  ``hw`` [., 2] int32 (height, width);
* ``skipped_ids`` int64 and ``skipped_reasons`` (strings);
* attributes ``meta`` (JSON), ``committed_records``, ``committed_rows``,
  ``committed_skipped`` and, while partial, ``progress`` (a streaming writer's
  note, JSON).

HDF5 files are not crash-safe, so each commit appends, flushes, and only then
advances the ``committed_*`` counters; a writer resuming after a kill
truncates the datasets back to them. A file too damaged to open or to resume is
started again (its records are redone, never trusted).

HDF5 meeting a full disk breaks the file and ends the process in a segmentation
fault, so it never does (pipeline/core/hdf5files.py): the room for each commit is
checked before it is written, and should the disk fill anyway, the reserve kept
beside the file (``<store>.partial.reserve``) is given back for HDF5 to close the
file at its last commit. Either way the refusal is one line, and the next run
resumes. Every dataset stays open while the file is: HDF5 writes a dataset's
cached chunks when the dataset is closed, and a write failing there would be lost
in h5py's deallocation, unseen.

Every dataset is written with HDF5's Fletcher-32 filter (metadata
``"record_checksum": "fletcher32"``): HDF5 checks each chunk it reads, and a
reader turns a failed check, or a file whose structure no longer parses, into
``PATH: image ID: record is damaged`` rather than wrong numbers.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import contextmanager, suppress

import h5py
import numpy as np

from pipeline.core.errors import CapstackError
from pipeline.core.hdf5files import Reserve, check_room, disk_refusal
from pipeline.features.stores.base import Batch, Record, StoreReader, StoreWriter

_STR = h5py.string_dtype()
CHECKSUM = "fletcher32"
RESERVE_SUFFIX = ".reserve"  # beside the partial store while it is written
_DAMAGE = (OSError, RuntimeError, KeyError, ValueError)  # h5py's errors on a damaged file
log = logging.getLogger(__name__)


class Hdf5Writer(StoreWriter):
    def __init__(self, path, meta):
        super().__init__(path, meta)
        self._file = None
        self._sets: dict[str, h5py.Dataset] = {}
        self._chunk_bytes = 0
        self.meta["record_checksum"] = CHECKSUM
        with self.refusals_named():
            self._reserve = Reserve(self.partial.with_name(self.partial.name + RESERVE_SUFFIX))
        try:
            if self.partial.exists():
                with self.refusals_named():
                    self._reopen()
            if self._file is None:
                with self.refusals_named(), self._guarded(0):
                    self._create()
        except BaseException:
            self.close()
            raise

    def _reopen(self) -> None:
        """Resume the partial store, or, when it is too damaged to open or to resume (a kill
        in the middle of a commit, HDF5 having met a full disk), start it again: its records
        are redone, never trusted."""
        try:
            self._file = h5py.File(self.partial, "a")
            self._hold_datasets()
            self._resume()
        except _DAMAGE as error:
            refusal = disk_refusal(error)
            if refusal is not None:  # read-only, say: the partial store is not the problem
                self.close()
                raise refusal from None
            log.warning("%s: damaged (%s); starting it again", self.partial,
                        str(error).splitlines()[0] if str(error) else type(error).__name__)
            self._drop_file()
            self.done.clear()
            self.skipped.clear()
            self.progress = None
            self.partial.unlink()

    @contextmanager
    def _guarded(self, nbytes: int):
        """A write of about ``nbytes`` to the file: refused before HDF5 sees it when the disk
        lacks the room (with a chunk of every dataset, rewritten); should HDF5 fail anyway,
        the reserve is given back, the file closed whole at its last commit, and the disk's
        refusal raised as an OSError."""
        check_room(self.partial, nbytes + self._chunk_bytes)
        try:
            yield
        except Exception as error:
            refusal = disk_refusal(error)
            self._reserve.release()
            self._drop_file()
            if refusal is None:
                raise
            raise refusal from None

    def _drop_file(self) -> None:
        """Close the file after HDF5 failed on it, whatever closing it raises."""
        self._sets = {}
        with suppress(*_DAMAGE):
            if self._file is not None:
                self._file.close()
        self._file = None

    def _create(self) -> None:
        f = self._file = h5py.File(self.partial, "w")
        for field in self.schema.fields:  # chunks of ~256 KiB of rows (64 rows of 2048 float16s)
            rows = max(1, min(4096, (1 << 18) // (field.row_size * field.dtype.itemsize)))
            f.create_dataset(field.name, (0, *field.shape), field.dtype, fletcher32=True,
                             maxshape=(None, *field.shape), chunks=(rows, *field.shape))
        for name, dtype in (("image_ids", np.int64), ("row_start", np.int64),
                            ("row_count", np.int32), ("skipped_ids", np.int64),
                            ("skipped_reasons", _STR)):
            f.create_dataset(name, (0,), dtype, maxshape=(None,), chunks=(4096,),
                             fletcher32=dtype is not _STR)  # HDF5 filters no variable lengths
        f.create_dataset("hw", (0, 2), np.int32, maxshape=(None, 2), chunks=(4096, 2),
                         fletcher32=True)
        f.attrs["meta"] = json.dumps(self.meta)
        self._hold_datasets()
        self._set_committed(0, 0, 0)

    def _hold_datasets(self) -> None:
        """Every dataset open while the file is (see the module's docstring), and the bytes of
        a chunk of each: what a commit rewrites besides what it appends."""
        self._sets = {name: d for name, d in self._file.items() if isinstance(d, h5py.Dataset)}
        self._chunk_bytes = sum(int(np.prod(d.chunks)) * d.dtype.itemsize
                                for d in self._sets.values() if d.chunks)

    def _set_committed(self, records: int, rows: int, skipped: int,
                       progress: dict | None = None) -> None:
        self._file.flush()
        counters: dict[str, int | str] = {"committed_records": records, "committed_rows": rows,
                                          "committed_skipped": skipped}
        if progress is not None:
            counters["progress"] = json.dumps(progress)
        self._file.attrs.update(counters)
        self._file.flush()

    def _counts(self) -> tuple[int, int, int]:
        a = self._file.attrs
        return int(a["committed_records"]), int(a["committed_rows"]), int(a["committed_skipped"])

    def _resume(self) -> None:
        f, sets = self._file, self._sets
        old = json.loads(f.attrs.get("meta", "{}"))
        if old.get("fingerprint") != self.meta["fingerprint"]:
            self.close()
            raise CapstackError(f"{self.partial}: an unfinished store made with other settings "
                                f"(fingerprint {old.get('fingerprint')}) is in the way; delete it")
        if old.get("record_checksum") != CHECKSUM:  # begun before datasets had checksums
            del self.meta["record_checksum"]
        records, rows, skipped = self._counts()
        progress = f.attrs.get("progress")
        self.progress = json.loads(progress) if progress is not None else None
        for name in ("image_ids", "row_start", "row_count", "hw"):
            sets[name].resize(records, axis=0)
        for name in self.schema.names:
            sets[name].resize(rows, axis=0)
        for name in ("skipped_ids", "skipped_reasons"):
            sets[name].resize(skipped, axis=0)
        self.done.update(int(i) for i in sets["image_ids"][:])
        for i, reason in zip(sets["skipped_ids"][:], sets["skipped_reasons"].asstr()[:]):
            self.done.add(int(i))
            self.skipped[int(i)] = reason

    @staticmethod
    def _append(dataset, values) -> None:
        n = dataset.shape[0]
        dataset.resize(n + len(values), axis=0)
        dataset[n:] = values

    def _commit(self, records, skipped, progress) -> None:
        size = sum(r[name].nbytes + 32 for _, r in records for name in self.schema.names) + \
            sum(len(reason.encode()) + 64 for _, reason in skipped)
        with self._guarded(size + len(json.dumps(progress or {}))):
            self._append_commit(records, skipped, progress)

    def _append_commit(self, records, skipped, progress) -> None:
        f = self._sets
        n_records, n_rows, n_skipped = self._counts()
        if records:
            counts = np.array([r.num for _, r in records], np.int32)
            starts = n_rows + np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
            for name in self.schema.names:
                self._append(f[name], np.concatenate([r[name] for _, r in records]))
            self._append(f["image_ids"], np.array([i for i, _ in records], np.int64))
            self._append(f["row_start"], starts)
            self._append(f["row_count"], counts)
            self._append(f["hw"], np.array([(r.height, r.width) for _, r in records], np.int32))
            n_records += len(records)
            n_rows += int(counts.sum())
        if skipped:
            self._append(f["skipped_ids"], np.array([i for i, _ in skipped], np.int64))
            self._append(f["skipped_reasons"], np.array([r for _, r in skipped], dtype=object))
            n_skipped += len(skipped)
        self._set_committed(n_records, n_rows, n_skipped, progress)

    def _write_final_meta(self) -> None:
        text = json.dumps(self.meta)
        with self._guarded(len(text)):
            self._file.attrs["meta"] = text
            if "progress" in self._file.attrs:
                del self._file.attrs["progress"]
            self._file.flush()

    def close(self) -> None:
        self._sets = {}
        if self._file is not None:
            self._file.close()
            self._file = None
        self._reserve.release()


class Hdf5Reader(StoreReader):
    _handle_file = None
    _handle_pid = None

    def _open(self) -> h5py.File:
        if self._handle_file is None or self._handle_pid != os.getpid():
            try:
                self._handle_file = h5py.File(self.path, "r")
            except OSError as e:
                raise CapstackError(f"{self.path}: cannot open HDF5 store ({e})") from None
            self._handle_pid = os.getpid()
        return self._handle_file

    @contextmanager
    def _damage_named(self, what: str):
        """HDF5's errors on a damaged file (a failed Fletcher-32 check, an unreadable
        B-tree or object header) as one line naming the store and ``what`` was read."""
        try:
            yield
        except (OSError, KeyError, RuntimeError, ValueError) as e:
            raise CapstackError(f"{self.path}: {what} is damaged ({e}); re-extract the "
                                f"store (capstack verify --deep checks every record)") from None

    def _raw_meta(self):
        with self._damage_named("the store's metadata"):
            return self._open().attrs.get("meta")

    def _read_ids(self) -> np.ndarray:
        f = self._open()
        with self._damage_named("the record index"):
            self._row_start = f["row_start"][:]
            self._row_count = f["row_count"][:]
            self._hw = f["hw"][:]
            ids = f["image_ids"][:]
        if not len(self._row_start) == len(self._row_count) == len(self._hw) == len(ids):
            raise CapstackError(f"{self.path}: the record index is damaged (its datasets "
                                f"disagree in length); re-extract the store")
        return ids

    def _get(self, image_id: int) -> Record:
        f = self._open()
        k = self._index[image_id]
        start, n = int(self._row_start[k]), int(self._row_count[k])
        with self._damage_named(f"image {image_id}: record"):
            fields = {name: f[name][start:start + n] for name in self.schema.names}
        return Record(height=int(self._hw[k, 0]), width=int(self._hw[k, 1]), **fields)

    def read_batch(self, image_ids, max_rows=None, allocate=np.empty, fields=()) -> Batch:
        """Each record read straight into the batch array (``read_direct``, no temporaries)."""
        ks = [self._index[int(i)] for i in image_ids]
        try:
            with self._damage_named(f"a record of images {list(map(int, image_ids))}"):
                return self._read_batch(ks, max_rows, allocate, fields)
        except CapstackError:
            for image_id in image_ids:  # a chunk holds several records: name the damaged one
                self._get(int(image_id))
            raise

    def _read_batch(self, ks, max_rows, allocate, fields) -> Batch:
        f = self._open()
        counts = self._row_count[ks].astype(np.int64)
        rows = int(counts.max()) if ks else 0
        rows = min(rows, max_rows) if max_rows else rows
        features = allocate((len(ks), rows, self.feature_dim), self.dtype)
        extra = self._padded(fields, rows, len(ks))
        datasets = [(f["features"], features)] + [(f[name], a) for name, a in extra.items()]
        for j, k in enumerate(ks):
            m = int(min(counts[j], rows))
            start = int(self._row_start[k])
            if m:
                for dataset, array in datasets:
                    dataset.read_direct(array, np.s_[start:start + m], np.s_[j, :m])
            if m < rows:
                features[j, m:] = 0
        mask = np.arange(rows)[None, :] < np.minimum(counts, rows)[:, None]
        return Batch(features, mask, self._hw[ks].astype(np.int32), extra)

    def close(self) -> None:
        if self._handle_file is not None and self._handle_pid == os.getpid():
            self._handle_file.close()
        self._handle_file = None
