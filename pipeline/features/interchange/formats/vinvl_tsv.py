"""``vinvl-tsv``: VinVL/Oscar ``features.tsv`` (with its ``features.lineidx``).

Headerless TSV: ``image_id, num_boxes, features``, the last base64 of float32
``[num_boxes, 2054]``: 2048 region features, then 6 box-geometry columns,
``x1/w, y1/h, x2/w, y2/h, (x2-x1)/w, (y2-y1)/h`` (fractions of the image, the
order MMF's VinVL extractor writes and Oscar's readers take). The file records
no image size, so ``--image-root`` is needed to store the boxes in pixels.
The ``.lineidx`` (one byte offset per line) is for random access; streaming
needs only the TSV, and the index is checked against it when present.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from pipeline.core.errors import CapstackError
from pipeline.features.interchange.formats import FORMATS
from pipeline.features.interchange.formats.base import BadRow, FeatureFormat, Step, expand_folders
from pipeline.features.interchange.formats.tsv import decode_array, integer, rows_of, tsv_steps
from pipeline.features.stores import Record

GEOMETRY = 6  # x1/w, y1/h, x2/w, y2/h, width/w, height/h


def parse_vinvl_line(parts: list[bytes], where: str) -> Record:
    n = integer(parts[1], "num_boxes")
    rows = rows_of(decode_array(parts[2], np.float32, "features"), n, "features")
    if rows.shape[1] <= GEOMETRY:
        raise BadRow(f"features of {rows.shape[1]} columns: expected D + {GEOMETRY} geometry")
    return Record(rows[:, :-GEOMETRY], 0, 0, boxes=rows[:, -GEOMETRY:-2])


def lineidx_of(tsv: Path) -> Path:
    return tsv.with_suffix(".lineidx")


@FORMATS.register("vinvl-tsv")
class VinvlTsv(FeatureFormat):
    """VinVL/Oscar features.tsv (image_id, num_boxes, base64 [N, 2048 + 6 box geometry])"""

    name = "vinvl-tsv"
    records_sizes = False
    boxes = "x1/w, y1/h, x2/w, y2/h: fractions of the image (VinVL's geometry columns)"
    relative_boxes = True

    def units(self, sources: list[Path]) -> list[Path]:
        units = expand_folders(sources, "*features*.tsv", "VinVL features TSV")
        for unit in units:
            self._check_lineidx(unit)
        return units

    @staticmethod
    def _check_lineidx(tsv: Path) -> None:
        index = lineidx_of(tsv)
        if not index.exists():
            return
        if not index.is_file():  # a FIFO would block the read
            raise CapstackError(f"{index}: not a regular file (VinVL's .lineidx is one)")
        try:
            offsets = [int(text) for text in index.read_text(encoding="ascii").split()]
        except (ValueError, UnicodeDecodeError):
            raise CapstackError(f"{index}: not a VinVL .lineidx (one byte offset, a whole "
                                f"number, per line)") from None
        size = tsv.stat().st_size
        if offsets and (offsets[0] != 0 or offsets[-1] >= size):
            raise CapstackError(f"{index}: its offsets do not fit {tsv} ({size} bytes): "
                                f"is it another file's index?")

    def steps(self, unit: Path, start) -> Iterator[Step]:
        return tsv_steps(unit, start, 3, 0, parse_vinvl_line)

    def producer(self, units: list[Path]) -> dict:
        return {"layout": "VinVL/Oscar features.tsv + .lineidx",
                "geometry_columns": "x1/w, y1/h, x2/w, y2/h, width/w, height/h (dropped once "
                                    "the boxes are in pixels)"}
