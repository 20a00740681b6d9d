"""``butd-tsv``: peteanderson80/bottom-up-attention's ``tools/generate_tsv.py`` output.

Headerless TSV, one image a line: ``image_id, image_w, image_h, num_boxes,
boxes, features``, the last two base64 of float32 ``[num_boxes, 4]`` (x1, y1,
x2, y2 in image pixels) and ``[num_boxes, 2048]``. The adaptive 10-100 box
files come in parts (``trainval_resnet101_faster_rcnn_genome.tsv.0`` ... ``.3``),
the fixed 36 box ones as one file; a folder given as SOURCE means every
``*.tsv*`` file in it. The layout carries neither classes nor scores.

LXMERT's conversion (``data/mscoco_imgfeat/extract_coco_image.py``) keeps them
in ten columns, told apart by their count: ``img_id`` (the file stem),
``img_h``, ``img_w`` (height first), ``objects_id`` (int64), ``objects_conf``,
``attrs_id`` (int64), ``attrs_conf``, ``num_boxes``, ``boxes``, ``features``:
such files import with classes, scores, attributes and attribute scores.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Iterator

import numpy as np

from pipeline.core.errors import CapstackError
from pipeline.features.interchange.formats import FORMATS, WRITERS
from pipeline.features.interchange.formats.base import FeatureFormat, Step, expand_folders
from pipeline.features.interchange.formats.tsv import decode_array, integer, rows_of, tsv_steps
from pipeline.features.stores import Record, StoreReader

COLUMNS = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
LXMERT_COLUMNS = ("img_id", "img_h", "img_w", "objects_id", "objects_conf", "attrs_id",
                  "attrs_conf", "num_boxes", "boxes", "features")


def parse_butd_line(parts: list[bytes], where: str) -> Record:
    width, height = integer(parts[1], "image_w"), integer(parts[2], "image_h")
    n = integer(parts[3], "num_boxes")
    boxes = rows_of(decode_array(parts[4], np.float32, "boxes"), n, "boxes", 4)
    features = rows_of(decode_array(parts[5], np.float32, "features"), n, "features")
    return Record(features, height, width, boxes=boxes)


def parse_lxmert_line(parts: list[bytes], where: str) -> Record:
    height, width = integer(parts[1], "img_h"), integer(parts[2], "img_w")
    n = integer(parts[7], "num_boxes")
    per_box = {name: rows_of(decode_array(parts[k], dtype, column), n, column, 1)[:, 0]
               for name, k, dtype, column in (("classes", 3, np.int64, "objects_id"),
                                              ("scores", 4, np.float32, "objects_conf"),
                                              ("attributes", 5, np.int64, "attrs_id"),
                                              ("attribute_scores", 6, np.float32, "attrs_conf"))}
    boxes = rows_of(decode_array(parts[8], np.float32, "boxes"), n, "boxes", 4)
    features = rows_of(decode_array(parts[9], np.float32, "features"), n, "features")
    return Record(features, height, width, boxes=boxes, **per_box)


def columns_of(path: Path) -> int:
    """How many columns the first line of ``path`` has (6: BUTD, 10: LXMERT)."""
    tabs = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            line, newline, _ = chunk.partition(b"\n")
            tabs += line.count(b"\t")
            if newline:
                break
    return tabs + 1


@FORMATS.register("butd-tsv")
class ButdTsv(FeatureFormat):
    """bottom-up-attention's generate_tsv.py TSV (image_id, w, h, num_boxes, boxes, features)"""

    name = "butd-tsv"

    def units(self, sources: list[Path]) -> list[Path]:
        return expand_folders(sources, "*.tsv*", "BUTD TSV")

    def steps(self, unit: Path, start) -> Iterator[Step]:
        if columns_of(unit) == len(LXMERT_COLUMNS):
            return tsv_steps(unit, start, len(LXMERT_COLUMNS), 0, parse_lxmert_line)
        return tsv_steps(unit, start, len(COLUMNS), 0, parse_butd_line)

    def producer(self, units: list[Path]) -> dict:
        if columns_of(units[0]) == len(LXMERT_COLUMNS):
            return {"layout": "airsplay/lxmert extract_coco_image.py (10 columns)",
                    "columns": list(LXMERT_COLUMNS),
                    "classes": "0-based over Visual Genome's 1600 classes (objects_id)"}
        return {"layout": "peteanderson80/bottom-up-attention tools/generate_tsv.py",
                "columns": list(COLUMNS)}


@WRITERS.register("butd-tsv")
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
