"""LMDB feature store (the default): one key per image, read without locks.

Layout of the environment (a folder ending in ``.lmdb``):

* ``r:<image id>`` -> header ``<iiii`` (N rows, the features' D, height, width),
  then each declared field's N rows in the schema's order, ``features`` first
  (so a record of the first format, features then boxes, scores, classes, reads
  as one of today's with those fields declared), then, when the metadata says
  ``"record_checksum": "xxh3_64"`` (every store written since), the XXH3-64 hash
  of all that (``<Q``). LMDB checks nothing itself: a flipped bit on disk would
  be read as a feature value, so each read checks the records it touches (XXH3
  hashes a 147 KB record in about 3 us, CRC-32 in 33 us: a copy of it takes 4.5);
* ``s:<image id>`` -> the reason the image was skipped;
* ``__meta__`` -> the metadata JSON; ``__ids__`` -> the record ids (int64),
  written by ``finish``; ``__progress__`` -> a streaming writer's progress note
  while the store is partial.

py-lmdb refuses to open an environment twice in one process, and a child made
by ``fork`` inherits its parent's open environments. Readers therefore share
one read-only environment per path and process (:func:`shared_env`), opened
lazily; a forked child first closes the copies it inherited (closing them
there touches only the child's own mappings) before opening its own.
"""

from __future__ import annotations

import json
import os
import struct
from functools import cached_property
from pathlib import Path
from typing import cast

import lmdb
import numpy as np
from xxhash import xxh3_64_intdigest

from pipeline.core.errors import CapstackError
from pipeline.features.stores.base import Batch, Record, StoreReader, StoreWriter
from pipeline.features.stores.lmdb_pages import check_complete
from pipeline.features.stores.schema import Schema

_HEADER = struct.Struct("<iiii")
_CHECKSUM = struct.Struct("<Q")
CHECKSUM = "xxh3_64"
_META, _IDS, _PROGRESS = b"__meta__", b"__ids__", b"__progress__"
_MAP_SIZE = 1 << 40  # address space only; the file grows with the data


def _record_key(image_id: int) -> bytes:
    return b"r:%d" % image_id


def _skip_key(image_id: int) -> bytes:
    return b"s:%d" % image_id


def encode_record(record: Record, schema: Schema, checksum: bool = True) -> bytes:
    n = record.num
    body = b"".join([_HEADER.pack(n, schema.feature_dim, record.height, record.width),
                     *(np.ascontiguousarray(record[f.name]).tobytes() for f in schema.fields)])
    return body + _CHECKSUM.pack(xxh3_64_intdigest(body)) if checksum else body


def check_record_bytes(buf, row_bytes: int, checksum: bool, where, image_id: int) -> None:
    """Refuse a record whose length disagrees with its header (``row_bytes`` a row, every field)
    or, in a store that keeps checksums, whose hash does not match: it was damaged after it
    was written. Called once per record read, so kept to a few operations."""
    trailer = _CHECKSUM.size if checksum else 0
    size = len(buf)
    n = _HEADER.unpack_from(buf, 0)[0] if size >= _HEADER.size else -1
    if n < 0 or size != _HEADER.size + n * row_bytes + trailer:
        raise CapstackError(f"{where}: image {image_id}: record is damaged ({size} bytes "
                            f"do not match its header); re-extract the store")
    if trailer and xxh3_64_intdigest(buf[:size - trailer]) != \
            _CHECKSUM.unpack_from(buf, size - trailer)[0]:
        raise CapstackError(f"{where}: image {image_id}: record is damaged (checksum mismatch); "
                            f"re-extract the store (capstack verify --deep checks every record)")


def row_bytes(schema: Schema) -> int:
    """Bytes of one row of every field: a record of N rows is the header and N of these."""
    return sum(f.row_size * f.dtype.itemsize for f in schema.fields)


def field_offsets(n: int, schema: Schema) -> list[int]:
    """Byte offset of each field of a record of ``n`` rows (after the header)."""
    offsets, at = [], _HEADER.size
    for f in schema.fields:
        offsets.append(at)
        at += n * f.row_size * f.dtype.itemsize
    return offsets


def decode_record(buf, schema: Schema) -> Record:
    n, _, height, width = _HEADER.unpack_from(buf, 0)
    arrays = {f.name: np.frombuffer(buf, f.dtype, n * f.row_size, at).reshape(n, *f.shape).copy()
              for f, at in zip(schema.fields, field_offsets(n, schema))}
    return Record(height=height, width=width, **arrays)


class LmdbWriter(StoreWriter):
    write_errors = (OSError, lmdb.Error)

    def __init__(self, path, meta):
        super().__init__(path, meta)
        resuming = self.partial.exists()
        if resuming and (self.partial / "data.mdb").is_file():
            check_complete(self.partial / "data.mdb")
        self._env = None
        with self.refusals_named():
            self._env = lmdb.open(str(self.partial), map_size=_MAP_SIZE, subdir=True)
        self.meta["record_checksum"] = CHECKSUM
        if resuming:
            self._resume()
        else:
            with self._env.begin(write=True) as txn:
                txn.put(_META, json.dumps(self.meta).encode())

    def _resume(self) -> None:
        with self._env.begin() as txn:
            old = json.loads(bytes(txn.get(_META) or b"{}"))
            if old.get("fingerprint") != self.meta["fingerprint"]:
                self.close()
                raise CapstackError(
                    f"{self.partial}: an unfinished store made with other settings "
                    f"(fingerprint {old.get('fingerprint')}) is in the way; delete it")
            if old.get("record_checksum") != CHECKSUM:  # begun before records had checksums
                del self.meta["record_checksum"]
            progress = txn.get(_PROGRESS)
            self.progress = json.loads(bytes(progress)) if progress is not None else None
            for key, value in txn.cursor():
                if key.startswith(b"r:"):
                    self.done.add(int(key[2:]))
                elif key.startswith(b"s:"):
                    self.done.add(int(key[2:]))
                    self.skipped[int(key[2:])] = bytes(value).decode()

    def _commit(self, records, skipped, progress) -> None:
        with self._env.begin(write=True) as txn:
            if progress is not None:
                txn.put(_PROGRESS, json.dumps(progress).encode())
            for image_id, record in records:
                txn.put(_record_key(image_id), encode_record(
                    record, self.schema, checksum="record_checksum" in self.meta))
            for image_id, reason in skipped:
                txn.put(_skip_key(image_id), reason.encode())

    def _write_final_meta(self) -> None:
        ids = np.array(sorted(self.done - set(self.skipped)), dtype=np.int64)
        with self._env.begin(write=True) as txn:
            txn.put(_META, json.dumps(self.meta).encode())
            txn.put(_IDS, ids.tobytes())
            txn.delete(_PROGRESS)
        self._env.sync(True)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


class _EnvCache:
    """Read-only environments of this process, by path (py-lmdb allows one each)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.envs: dict[str, lmdb.Environment] = {}

    def get(self, path: str) -> lmdb.Environment:
        if self.pid != os.getpid():  # a forked child: drop what the parent had open
            for stale in self.envs.values():
                stale.close()
            self.envs, self.pid = {}, os.getpid()
        env = self.envs.get(path)
        if env is None:
            check_complete(Path(path) / "data.mdb")  # a short file would end the process (SIGBUS)
            env = lmdb.open(path, readonly=True, lock=False, readahead=False, subdir=True,
                            max_readers=4096)
            self.envs[path] = env
        return env

    def release(self, path: str) -> None:
        env = self.envs.pop(path, None) if self.pid == os.getpid() else None
        if env is not None:
            env.close()


_ENVS = _EnvCache()


def shared_env(path) -> lmdb.Environment:
    return _ENVS.get(os.path.realpath(path))


class LmdbReader(StoreReader):
    @cached_property
    def checksums(self) -> bool:
        return self.meta.get("record_checksum") == CHECKSUM

    @cached_property
    def row_bytes(self) -> int:
        return row_bytes(self.schema)

    @cached_property
    def real_path(self) -> str:
        """The environment's key in this process (realpath: a few lstat calls, once)."""
        return os.path.realpath(self.path)

    def _open(self) -> lmdb.Environment:
        try:
            return _ENVS.get(self.real_path)
        except lmdb.Error as e:
            raise CapstackError(f"{self.path}: cannot open LMDB store ({e})") from None

    def _raw_meta(self):
        with self._open().begin(buffers=False) as txn:
            return txn.get(_META)

    def _read_ids(self) -> np.ndarray:
        with self._open().begin() as txn:
            raw = txn.get(_IDS)
        if raw is None:
            raise CapstackError(f"{self.path}: store has no record index (unfinished?)")
        return np.frombuffer(raw, dtype=np.int64).copy()

    def _get(self, image_id: int) -> Record:
        with self._open().begin(buffers=True) as txn:
            buf = txn.get(_record_key(image_id))
            if buf is None:
                raise CapstackError(f"{self.path}: record of image {image_id} is missing")
            check_record_bytes(buf, self.row_bytes, self.checksums, self.path, image_id)
            return decode_record(buf, self.schema)

    def read_batch(self, image_ids, max_rows=None, allocate=np.empty, fields=()) -> Batch:
        """One read transaction; each record copied once, straight into the batch arrays.

        ``allocate(shape, dtype)`` makes the batch's feature array: a DataLoader
        worker passes one in shared memory so the batch crosses to the trainer
        without another copy.
        """
        d, dtype, head = self.feature_dim, self.dtype, _HEADER.size
        with self._open().begin(buffers=True) as txn:
            found = [txn.get(_record_key(int(i))) for i in image_ids]
            if any(b is None for b in found):
                missing = next(i for i, b in zip(image_ids, found) if b is None)
                raise KeyError(f"{self.path}: no record for image {missing}")
            bufs = cast("list[memoryview]", found)  # none is None: checked just above
            heads = [_HEADER.unpack_from(b, 0) for b in bufs]
            rows = max((h[0] for h in heads), default=0)
            rows = min(rows, max_rows) if max_rows else rows
            features = allocate((len(bufs), rows, d), dtype)
            flat = features.reshape(len(bufs), rows * d)  # a view: no per-record reshape
            counts = np.minimum([h[0] for h in heads], rows)
            extra = self._padded(fields, rows, len(bufs))
            wanted = [(self.schema.names.index(name), self.schema.get(name), array)
                      for name, array in extra.items()]
            check, size, checksums = check_record_bytes, self.row_bytes, self.checksums
            for k, (buf, m) in enumerate(zip(bufs, counts.tolist())):
                check(buf, size, checksums, self.path, image_ids[k])  # before the batch leaves
                flat[k, :m * d] = np.frombuffer(buf, dtype, m * d, head)
                if m < rows:
                    flat[k, m * d:] = 0
                if wanted:
                    offsets = field_offsets(heads[k][0], self.schema)
                    for index, f, array in wanted:
                        array[k, :m] = np.frombuffer(buf, f.dtype, m * f.row_size,
                                                     offsets[index]).reshape(m, *f.shape)
            mask = np.arange(rows)[None, :] < counts[:, None]
            hw = np.array([(h[2], h[3]) for h in heads], np.int32).reshape(-1, 2)
            return Batch(features, mask, hw, extra)

    def close(self) -> None:
        _ENVS.release(self.real_path)
