"""``bua-npz``: MILVLG/bottom-up-attention.pytorch's ``extract_features.py`` output.

One ``<image file stem>.npz`` per image: ``x`` float32 ``[N, 2048]`` (the
OpenVQA releases store it ``[2048, N]``: told apart by ``num_bbox``), ``bbox``
``[N, 4]`` (x1, y1, x2, y2 in image pixels), ``num_bbox``, ``image_h``,
``image_w``, and ``info``, a pickled dict (read with the restricted unpickler)
holding ``objects_id``/``objects_conf`` (0-based over Visual Genome's 1600
classes, background excluded) and, when the attribute head ran,
``attrs_id``/``attrs_conf``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from pipeline.core import safe_pickle
from pipeline.core.errors import CapstackError
from pipeline.features.interchange.formats import FORMATS
from pipeline.features.interchange.formats.base import (BadRow, FeatureFormat, Step, existing,
                                                        open_regular, readable, whole)
from pipeline.features.interchange.formats.folder import folder_steps, listing
from pipeline.features.stores import Record

# info key -> store field (d2 mode spells the classes "objects")
INFO_FIELDS = (("objects_id", "classes"), ("objects", "classes"), ("objects_conf", "scores"),
               ("attrs_id", "attributes"), ("attrs_conf", "attribute_scores"))


def bua_record(arrays: dict, where: str) -> Record:
    for key in ("x", "bbox", "num_bbox", "image_h", "image_w"):
        if key not in arrays:
            raise BadRow(f"no {key!r} array")
    n = whole(arrays["num_bbox"], "num_bbox")
    x = np.asarray(arrays["x"])
    if x.ndim == 2 and x.shape[0] != n and x.shape[1] == n:
        x = x.T  # OpenVQA's releases: [2048, N]
    if x.ndim != 2 or x.shape[0] != n:
        raise BadRow(f"num_bbox {n} disagrees with x of shape {list(x.shape)}")
    boxes = np.asarray(arrays["bbox"])
    if boxes.shape != (n, 4):
        raise BadRow(f"num_bbox {n} disagrees with bbox of shape {list(boxes.shape)}")
    fields = {"boxes": boxes}
    info = arrays.get("info")
    info = info.item() if isinstance(info, np.ndarray) and info.dtype == object else info
    if isinstance(info, dict):
        for key, name in INFO_FIELDS:
            if key in info and name not in fields:
                value = np.asarray(info[key])
                if value.shape != (n,):
                    raise BadRow(f"info[{key!r}] of shape {list(value.shape)} for {n} boxes")
                fields[name] = value
    return Record(x, whole(arrays["image_h"], "image_h"), whole(arrays["image_w"], "image_w"),
                  **fields)


@FORMATS.register("bua-npz")
class BuaNpz(FeatureFormat):
    """MILVLG bottom-up-attention.pytorch <stem>.npz (x, bbox, image_h/w, info: classes, attrs)"""

    name = "bua-npz"

    def units(self, sources: list[Path]) -> list[Path]:
        for source in existing(sources, "bua-npz folder"):
            if not source.is_dir():
                raise CapstackError(f"{source}: expected a folder of <stem>.npz files")
        return list(sources)

    def steps(self, unit: Path, start) -> Iterator[Step]:
        def read(path: Path) -> Record:
            with open_regular(path) as handle:
                return bua_record(readable(safe_pickle.load_npz, handle, str(path)), str(path))

        return folder_steps(listing(unit, ".npz"), start, read)

    def producer(self, units: list[Path]) -> dict:
        return {"layout": "MILVLG/bottom-up-attention.pytorch extract_features.py",
                "classes": "0-based over Visual Genome's 1600 object classes (objects_id)",
                "attributes": "0-based over Visual Genome's 400 attributes (attrs_id)"}
