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

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from pipeline.core.errors import CapstackError
from pipeline.core.safe_pickle import RefusedPickle
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
    """``paths`` when each exists; else refuse naming the first missing one."""
    for path in paths:
        if not path.exists():
            raise CapstackError(f"{path}: {what} not found")
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
