"""Feature stores: one interface, two backends, chosen by the path's suffix or ``format``.

``.lmdb`` (a folder) -> LMDB, the default; ``.h5`` / ``.hdf5`` -> HDF5. ``open_store``
also takes a pointer file (``.json``) and opens the store it names.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.core.errors import CapstackError
from pipeline.core.pointer import read_pointer
from pipeline.features.stores.base import Batch, StoreReader, StoreWriter, partial_path
from pipeline.features.stores.schema import Field, Record, Schema, field

FORMATS = {"lmdb": (".lmdb",), "hdf5": (".h5", ".hdf5")}


def store_format(path: str | Path, format: str | None = None) -> str:
    """``lmdb`` or ``hdf5``: ``format`` when given, else from the suffix; never guessed."""
    if format is not None:
        if format not in FORMATS:
            raise CapstackError(f"{path}: unknown store format {format!r} "
                                f"(choose {', '.join(FORMATS)})")
        return format
    suffix = Path(path).suffix.lower()
    for name, suffixes in FORMATS.items():
        if suffix in suffixes:
            return name
    raise CapstackError(f"{path}: cannot tell the store format from the suffix {suffix!r}; "
                        f"name it .lmdb or .h5, or pass --format lmdb|hdf5")


def open_store(path: str | Path, format: str | None = None) -> StoreReader:
    """A reader of the complete store at ``path``, or of the store a pointer file (``.json``,
    a stage's out) names: the one place a pointer is dereferenced for reading."""
    path = read_pointer(path)
    if store_format(path, format) == "lmdb":
        from pipeline.features.stores.lmdb import LmdbReader
        return LmdbReader(path)
    from pipeline.features.stores.hdf5 import Hdf5Reader
    return Hdf5Reader(path)


def create_writer(path: str | Path, meta: dict, format: str | None = None) -> StoreWriter:
    """A writer of ``path`` (through ``path.partial``; resumes one left by a killed run)."""
    if store_format(path, format) == "lmdb":
        from pipeline.features.stores.lmdb import LmdbWriter
        return LmdbWriter(path, meta)
    from pipeline.features.stores.hdf5 import Hdf5Writer
    return Hdf5Writer(path, meta)


def remove_store(path: str | Path) -> None:
    """Delete a store, complete or partial, its lock file and the reserve of room an HDF5
    store's writer keeps beside it (left by a killed one)."""
    path = Path(path)
    partial = partial_path(path)
    for each in (path, partial, partial.with_name(partial.name + ".reserve")):
        if each.is_dir():
            shutil.rmtree(each)
        elif each.exists():
            each.unlink()
    lock = path.with_name(path.name + ".lock")
    if lock.exists():
        lock.unlink()


__all__ = ["Batch", "Field", "Record", "Schema", "StoreReader", "StoreWriter", "create_writer",
           "field", "open_store", "partial_path", "remove_store", "store_format"]
