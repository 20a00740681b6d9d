"""What every importable format provides: its files, and its rows one after another.

A format reads *units* (a TSV file, a folder of npz files, an LMDB, an HDF5
file) and yields their rows in a fixed order, each with the *position* after
it (a byte offset, a file index, a key index): the importer commits that
position with each batch, so a killed import resumes where it stopped. A row
names its image the way the source does (``key``: the id column, a file stem,
an LMDB key) and is read only when the importer wants it: features of images
outside the dataset are never decoded. Reading a row that is broken raises
:class:`BadRow` with the reason, which the importer records and goes past.
"""

from __future__ import annotations

import math
import os
import stat
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from pipeline.core import regular
from pipeline.core.errors import CapstackError
from pipeline.core.regular import not_regular
from pipeline.core.safe_pickle import MAX_ARRAY_BYTES, RefusedPickle
from pipeline.features.catalog import size_bytes
from pipeline.features.stores import Record


class BadRow(Exception):
    """One row of a source that cannot be imported (the reason is the message)."""




@dataclass
class SourceRow:
    key: str | None  # the image as the source names it; None when even that is unreadable
    where: str  # "file:line", "file[key]": what a report names
    read: Callable[[], Record]  # the row's record (image size 0 x 0 when the source has none)
    problem: str = ""  # why the key itself could not be read


@dataclass
class Step:
    position: object  # where the next row starts, JSON (what a resumed import seeks to)
    nbytes: int  # source bytes this row took (the progress bar's unit)
    row: SourceRow


class FeatureFormat(ABC):
    """One outside layout of features; subclasses register in ``FORMATS`` by name."""

    name: str = ""
    boxes: str = "x1, y1, x2, y2 in image pixels"  # the box convention the source uses
    relative_boxes: bool = False  # boxes are fractions of the image: pixels need its size
    records_sizes: bool = True  # rows say their image's size (else 0 x 0 unless --image-root)
    grid: int | None = None  # set once a grid-shaped record was read: rows are grid x grid

    def __init__(self):
        self.grid = None

    @abstractmethod
    def units(self, sources: list[Path]) -> list[Path]:
        """The units the given paths hold, in import order; refuses what is not this format."""

    @abstractmethod
    def steps(self, unit: Path, start) -> Iterator[Step]:
        """The unit's rows from ``start`` (0, or a position a step gave)."""

    def content(self, unit: Path) -> list[Path]:
        """The files or folders whose content the unit's records come from (hashed)."""
        return [unit]

    def size(self, unit: Path) -> int:
        """Bytes of the unit, for the progress bar."""
        return sum(size_bytes(p) for p in self.content(unit))

    def producer(self, units: list[Path]) -> dict:
        """What the files say about the program that made them (beyond the layout)."""
        return {}


def read_row(row: SourceRow) -> Record:
    """The row's record. Whatever goes wrong while reading one row (a value of the wrong type,
    a shape no array can take, a size beyond a bound) is that row's :class:`BadRow`, so the
    import records it and goes on, and its rerun goes past it too. Only a refused pickle
    stops the import: the source as a whole is not to be trusted."""
    if row.key is None:
        raise BadRow(row.problem)
    try:
        return row.read()
    except (BadRow, RefusedPickle):
        raise
    except Exception as error:  # noqa: BLE001 - any failure of one row is that row's
        raise BadRow(unreadable(error)) from None


def unreadable(error: BaseException) -> str:
    text = " ".join(str(error).split())
    if isinstance(error, CapstackError):
        return text.split(": ", 1)[-1]
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return f"unreadable ({text[:200]})"


def bounded(shape, itemsize: int, what: str) -> None:
    """Refuse (:class:`BadRow`) an array a file declares beyond :data:`MAX_ARRAY_BYTES`, before
    anything is allocated for it."""
    count = 1
    for side in shape:
        if not isinstance(side, (int, np.integer)) or side < 0:
            raise BadRow(f"{what}: declared shape {list(shape)} is not a shape")
        count *= int(side)
    if count * max(int(itemsize), 1) > MAX_ARRAY_BYTES:
        raise BadRow(f"{what}: declared shape {list(shape)} would take "
                     f"{count * itemsize / 2**20:,.0f} MiB, beyond the {MAX_ARRAY_BYTES >> 20} "
                     f"MiB one row's array may take")


def whole(value, name: str) -> int:
    """A count or an image side a file records (a number, or a one-element array of one): a
    whole number, 0 when it records none; else :class:`BadRow` naming the value."""
    if value is None:
        return 0
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(()).item()
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (float, np.floating)) and math.isfinite(value) \
            and float(value).is_integer():
        return int(value)
    raise BadRow(f"{name} {str(value)[:40]!r} is not a whole number")


def open_regular(path: Path):
    """``path`` open for binary reading, when it is a regular file; else :class:`BadRow`
    (pipeline/core/regular.py: a FIFO or a device may never answer, so it is never read)."""
    try:
        return regular.open_regular(path, "a feature file")
    except OSError as error:
        raise BadRow(f"{path}: cannot read ({error.strerror})") from None
    except regular.NotRegular as error:
        raise BadRow(str(error)) from None


def readable(load: Callable, *args):
    """``load(*args)``, with a file it cannot read made a :class:`BadRow` of its row (a
    refused pickle is not a bad row: it stops the import)."""
    try:
        return load(*args)
    except RefusedPickle:
        raise
    except CapstackError as error:
        raise BadRow(str(error).split(": ", 1)[-1]) from None


def existing(paths: list[Path], what: str) -> list[Path]:
    """``paths`` when each is a regular file or a folder; else refuse naming the first that
    is missing or is something else (a FIFO would block the import forever)."""
    for path in paths:
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise CapstackError(f"{path}: {what} not found") from None
        except OSError as error:
            raise CapstackError(f"{path}: cannot read ({error.strerror})") from None
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise CapstackError(f"{path}: {not_regular(mode)}: expected a {what}")
    return paths


def expand_folders(sources: list[Path], pattern: str, what: str) -> list[Path]:
    """Each file as given; each folder as its files matching ``pattern``, sorted by name."""
    out = []
    for source in existing(sources, what):
        if source.is_dir():
            found = sorted(p for p in source.glob(pattern) if p.is_file())
            if not found:
                raise CapstackError(f"{source}: no {pattern} files in this folder ({what})")
            out += found
        else:
            out.append(source)
    return out
