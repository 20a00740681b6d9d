"""Reading the tab-separated, base64-column files of the bottom-up family (BUTD, VinVL).

Each line is one image; array columns are base64 of raw little-endian bytes.
Lines are read as bytes (no csv module, no text decoding: a 23 GB file streams
at the speed of base64 decoding), and a line's position is its byte offset (and
number), so a resumed import seeks straight to the first line not yet committed.
"""

from __future__ import annotations

import binascii
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pybase64

from pipeline.core.errors import CapstackError
from pipeline.features.interchange.formats.base import MAX_ARRAY_BYTES, BadRow, SourceRow, Step
from pipeline.features.stores import Record

_READ_BUFFER = 1 << 22
MAX_LINE = MAX_ARRAY_BYTES * 3 // 2  # a row's arrays in base64, and its other columns

ParseLine = Callable[[list[bytes], str], Record]


def decode_array(text: bytes, dtype, column: str) -> np.ndarray:
    """A base64 column as a flat array, or :class:`BadRow` naming the column.

    pybase64's SIMD decoder is some 40 times faster than the standard library's
    (which alone would bound an import at ~300 MB/s); a column it refuses is
    decoded again by the standard library for the reason users know ("Incorrect
    padding") and, if that accepts it (stray characters it skips), taken from there."""
    try:
        raw = pybase64.b64decode(text, validate=True)
    except binascii.Error:
        try:
            raw = binascii.a2b_base64(text)
        except binascii.Error as error:
            raise BadRow(f"{column}: base64 does not decode ({error})") from None
    itemsize = np.dtype(dtype).itemsize
    if len(raw) % itemsize:
        raise BadRow(f"{column}: {len(raw)} bytes is not a whole number of "
                     f"{np.dtype(dtype).name} values")
    return np.frombuffer(raw, dtype)


def rows_of(flat: np.ndarray, n: int, column: str, width: int | None = None) -> np.ndarray:
    """``flat`` as ``n`` rows (of ``width`` values when given), or :class:`BadRow`."""
    if n < 0:
        raise BadRow(f"num_boxes {n} is negative")
    if n == 0:
        if flat.size:
            raise BadRow(f"num_boxes 0 disagrees with {column} of {flat.size} values")
        return flat.reshape(0, width or 0)
    if flat.size % n or (width is not None and flat.size != n * width):
        rows = f"{flat.size / (width or 1):g} rows" if width else f"{flat.size} values"
        raise BadRow(f"num_boxes {n} disagrees with {column} of {rows}")
    return flat.reshape(n, flat.size // n)


def integer(text: bytes, column: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise BadRow(f"{column} {text[:40]!r} is not an integer") from None


def tsv_steps(path: Path, start, columns: int, id_column: int,
              parse: ParseLine) -> Iterator[Step]:
    """Every line of ``path`` from ``start`` (``[byte offset, line number]``, or 0): its key
    is column ``id_column``; reading it splits the line into ``columns`` columns and hands
    them to ``parse``."""
    offset, number = start if start else (0, 0)
    try:
        handle = open(path, "rb", buffering=_READ_BUFFER)
    except OSError as error:
        raise CapstackError(f"{path}: cannot read ({error.strerror})") from None
    with handle:
        handle.seek(offset)
        while line := handle.readline(MAX_LINE):
            nbytes = len(line)
            number += 1
            if not line.endswith(b"\n") and nbytes == MAX_LINE:
                nbytes += _skip_line(handle)
                offset += nbytes
                yield Step([offset, number], nbytes, _too_long(line, f"{path}:{number}",
                                                               id_column, nbytes))
                continue
            offset += nbytes
            stripped = line.rstrip(b"\r\n")
            if stripped:
                row = _row(stripped, f"{path}:{number}", columns, id_column, parse)
                yield Step([offset, number], nbytes, row)


def _skip_line(handle) -> int:
    """Read past the rest of a line, a bounded chunk at a time; the bytes it took."""
    skipped = 0
    while chunk := handle.readline(MAX_LINE):
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped


def _too_long(head: bytes, where: str, id_column: int, nbytes: int) -> SourceRow:
    """A line beyond :data:`MAX_LINE`: a bad row under the id it starts with."""
    def read() -> Record:
        raise BadRow(f"a line of {nbytes / 2**20:,.0f} MiB, beyond the {MAX_LINE >> 20} MiB a "
                     f"row may take (a missing line break?)")

    parts = head[:1 << 16].split(b"\t")
    if len(parts) <= id_column + 1:
        return SourceRow(None, where, read,
                         problem=f"a line of {nbytes} bytes with no id column in its first 64 KiB")
    return SourceRow(parts[id_column].strip().decode("utf-8", "replace"), where, read)


def _row(line: bytes, where: str, columns: int, id_column: int, parse: ParseLine) -> SourceRow:
    parts = line.split(b"\t")

    def read() -> Record:
        if len(parts) != columns:
            raise BadRow(f"{len(parts)} columns, expected {columns} (a short or damaged line)")
        return parse(parts, where)

    if len(parts) <= id_column:
        return SourceRow(None, where, read, problem=f"{len(parts)} columns, expected {columns}")
    key = parts[id_column].strip().decode("utf-8", "replace")
    return SourceRow(key, where, read)
