"""``butd-tsv``: peteanderson80/bottom-up-attention's ``tools/generate_tsv.py`` output.

Headerless TSV, one image a line: ``image_id, image_w, image_h, num_boxes,
boxes, features``, the last two base64 of float32 ``[num_boxes, 4]`` (x1, y1,
x2, y2 in image pixels) and ``[num_boxes, 2048]``. The adaptive 10-100 box
files come in parts (``trainval_resnet101_faster_rcnn_genome.tsv.0`` ... ``.3``),
the fixed 36 box ones as one file; a folder given as SOURCE means every
``*.tsv*`` file in it. The layout carries neither classes nor scores.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Iterator

import numpy as np

from pipeline.core.errors import CapstackError
from pipeline.features.interchange.formats import FORMATS
from pipeline.features.interchange.formats.base import FeatureFormat, Step, expand_folders
from pipeline.features.interchange.formats.tsv import decode_array, integer, rows_of, tsv_steps
from pipeline.features.stores import Record, StoreReader

COLUMNS = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")


def parse_butd_line(parts: list[bytes], where: str) -> Record:
    width, height = integer(parts[1], "image_w"), integer(parts[2], "image_h")
    n = integer(parts[3], "num_boxes")
    boxes = rows_of(decode_array(parts[4], np.float32, "boxes"), n, "boxes", 4)
    features = rows_of(decode_array(parts[5], np.float32, "features"), n, "features")
    return Record(features, height, width, boxes=boxes)


@FORMATS.register("butd-tsv")
class ButdTsv(FeatureFormat):
    """bottom-up-attention's generate_tsv.py TSV (image_id, w, h, num_boxes, boxes, features)"""

    name = "butd-tsv"

    def units(self, sources: list[Path]) -> list[Path]:
        return expand_folders(sources, "*.tsv*", "BUTD TSV")

    def steps(self, unit: Path, start) -> Iterator[Step]:
        return tsv_steps(unit, start, len(COLUMNS), 0, parse_butd_line)

    def producer(self, units: list[Path]) -> dict:
        return {"layout": "peteanderson80/bottom-up-attention tools/generate_tsv.py",
                "columns": list(COLUMNS)}


class ButdTsvWriter:
    """A store's region records as one BUTD TSV (``\\r\\n`` lines, as csv.DictWriter wrote them)."""

    def __init__(self, store: StoreReader, partials: list[Path]):
        self.handle = open(partials[0], "w", newline="")

    @staticmethod
    def targets(store: StoreReader, out: Path) -> list[Path]:
        if not store.schema.has("boxes") or store.schema.grid:
            raise CapstackError(f"{store.path}: butd-tsv holds regions with their boxes, and "
                                f"this store holds {store.schema.describe()}: export it as "
                                f"rtl-npz")
        return [out]

    def write(self, image_id: int, record: Record) -> None:
        columns = [str(image_id), str(record.width), str(record.height), str(record.num),
                   _b64(record["boxes"]), _b64(record.features)]
        self.handle.write("\t".join(columns) + "\r\n")

    def close(self) -> None:
        self.handle.close()


def _b64(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array, np.float32).tobytes()).decode("ascii")
