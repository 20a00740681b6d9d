"""Reading the one-file-per-image folders of several toolkits (npz, npy + info).

A folder's position is the index of the next file in its sorted listing, so a
resumed import starts at the first file not yet committed.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Callable, Iterator

from pipeline.core.errors import CapstackError
from pipeline.features.interchange.formats.base import SourceRow, Step
from pipeline.features.stores import Record

ReadFile = Callable[[Path], Record]


def listing(folder: Path, suffix: str, exclude: str | None = None) -> list[Path]:
    """The folder's ``*suffix`` files (not ``*exclude``), sorted by name."""
    try:
        names = sorted(p for p in folder.iterdir() if p.name.endswith(suffix)
                       and not (exclude and p.name.endswith(exclude)))
    except OSError as error:
        raise CapstackError(f"{folder}: cannot list ({error.strerror})") from None
    return names


def folder_steps(files: list[Path], start, read: ReadFile) -> Iterator[Step]:
    """One row per file from index ``start``; its key is the file's stem."""
    for index in range(int(start or 0), len(files)):
        path = files[index]
        stem = path.name.split(".")[0]
        try:
            nbytes = path.stat().st_size
        except OSError:
            nbytes = 0
        yield Step(index + 1, nbytes, SourceRow(stem, str(path), partial(read, path)))
