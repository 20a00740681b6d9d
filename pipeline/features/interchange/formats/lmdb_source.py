"""Reading other toolkits' LMDB files (single-file or folder) key by key, in key order.

A position is the last key taken (as text), so a resumed import seeks just
past it. Reserved entries (lmdbdict's ``__keys__``, MMF's ``keys``) are not
records and are skipped.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Callable, Iterator

import lmdb

from pipeline.core.errors import CapstackError
from pipeline.features.interchange.formats.base import SourceRow, Step
from pipeline.features.stores import Record
from pipeline.features.stores.lmdb_pages import check_complete

DecodeValue = Callable[[str, bytes, str], Record]  # key, value, where -> record


def open_lmdb(path: Path) -> lmdb.Environment:
    """A read-only environment of ``path``: a folder (data.mdb) or a single file."""
    check_complete(data_file(path))  # a short file would end the process (SIGBUS)
    try:
        return lmdb.open(str(path), subdir=path.is_dir(), readonly=True, lock=False,
                         readahead=False, max_readers=8)
    except lmdb.Error as error:
        raise CapstackError(f"{path}: not an LMDB file ({error})") from None


def data_file(path: Path) -> Path:
    """The file holding an LMDB's data (what is hashed; the lock file is not content); refused
    when it is a FIFO or a device, which would block the hashing or the mapping."""
    data = path / "data.mdb" if path.is_dir() else path
    if data.exists() and not data.is_file():
        raise CapstackError(f"{data}: not a regular file: expected an LMDB's data file")
    return data


def reserved(key: bytes, extra: tuple[bytes, ...] = ()) -> bool:
    return (key.startswith(b"__") and key.endswith(b"__")) or key in extra


def lmdb_steps(path: Path, start, decode: DecodeValue,
               skip: tuple[bytes, ...] = ()) -> Iterator[Step]:
    env = open_lmdb(path)
    try:
        with env.begin(buffers=False) as txn:
            cursor = txn.cursor()
            found = cursor.set_range(str(start).encode()) if start else cursor.first()
            while found:
                key, value = cursor.key(), cursor.value()
                found = cursor.next()
                if (start and key == str(start).encode()) or reserved(key, skip):
                    continue
                text = key.decode("utf-8", "replace")
                where = f"{path}[{text}]"
                row = SourceRow(text, where, partial(decode, text, value, where))
                yield Step(text, len(key) + len(value), row)
    finally:
        env.close()
