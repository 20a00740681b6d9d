"""``mmf-npy`` and ``mmf-lmdb``: facebookresearch/mmf's feature folders and their LMDB.

MMF's extractors (``tools/scripts/features/extract_features_vmb.py``,
``extract_features_frcnn.py``) write ``<stem>.npy`` (float32 ``[N, 2048]``)
and ``<stem>_info.npy``, a pickled dict: ``bbox`` ``[N, 4]`` (x1, y1, x2, y2
in image pixels), ``num_boxes``, ``objects`` (class ids), ``cls_prob`` (``[N,
C]`` or ``[N]``), ``image_width``, ``image_height``. ``lmdb_conversion.py``
packs them into a folder LMDB: keys the relative stem, values a pickled dict of
``features`` and the info fields, and a reserved ``keys`` entry (ViLBERT's
conversion names them ``boxes``, ``image_w``, ``image_h``). Every pickle is
read with the restricted unpickler. The vmb extractor keeps 100 rows with a
smaller ``num_boxes`` (the confident ones), so the rows are what count.
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
from pipeline.features.interchange.formats.lmdb_source import data_file, lmdb_steps
from pipeline.features.stores import Record

INFO = "_info.npy"


def _first(info: dict, *names):
    return next((info[n] for n in names if info.get(n) is not None), None)


def mmf_record(features, info: dict) -> Record:
    if features is None:
        raise BadRow("no 'features' array")
    features = np.asarray(features)
    if features.ndim != 2:
        raise BadRow(f"features of shape {list(features.shape)}, expected [N, D]")
    n, fields = features.shape[0], {}
    boxes = _first(info, "bbox", "boxes")
    if boxes is not None:
        boxes = np.asarray(boxes)  # as stored: a complex or text box is the record's problem
        if boxes.shape != (n, 4):
            raise BadRow(f"bbox of shape {list(boxes.shape)} for {n} feature rows")
        fields["boxes"] = boxes
    classes = info.get("objects")
    if classes is not None:
        fields["classes"] = _per_row(classes, n, "objects")
    prob = info.get("cls_prob")
    if prob is not None:
        prob = np.asarray(prob)
        fields["scores"] = _per_row(prob.max(1) if prob.ndim == 2 else prob, n, "cls_prob")
    height = whole(_first(info, "image_height", "image_h"), "image_height")
    width = whole(_first(info, "image_width", "image_w"), "image_width")
    return Record(features, height, width, **fields)


def _per_row(values, n: int, name: str) -> np.ndarray:
    values = np.asarray(values)
    if values.shape != (n,):
        raise BadRow(f"{name} of shape {list(values.shape)} for {n} feature rows")
    return values


@FORMATS.register("mmf-npy")
class MmfNpy(FeatureFormat):
    """MMF's extractor folders: <stem>.npy features + <stem>_info.npy (pickled dict)"""

    name = "mmf-npy"

    def units(self, sources: list[Path]) -> list[Path]:
        for source in existing(sources, "MMF feature folder"):
            if not source.is_dir():
                raise CapstackError(f"{source}: expected a folder of <stem>.npy + "
                                    f"<stem>_info.npy files")
        return list(sources)

    def steps(self, unit: Path, start) -> Iterator[Step]:
        def read(path: Path) -> Record:
            saved = readable(_load_npy, path)
            if saved.dtype == object:  # ViLBERT's extractor: np.save(<stem>.npy, info | features)
                info = _dict_of(saved, path)
                return mmf_record(info.get("features"), info)
            info_path = path.with_name(path.name[:-len(".npy")] + INFO)
            info = _dict_of(readable(_load_npy, info_path), info_path) if info_path.exists() \
                else {}
            return mmf_record(saved, info)

        return folder_steps(listing(unit, ".npy", exclude=INFO), start, read)

    def producer(self, units: list[Path]) -> dict:
        return {"layout": "facebookresearch/mmf tools/scripts/features (extract_features_*)"}


def _load_npy(path: Path) -> np.ndarray:
    with open_regular(path) as f:
        return safe_pickle.load_npy(f, str(path))


def _dict_of(saved: np.ndarray, path: Path) -> dict:
    """The dict ``np.save`` of a dict holds (a 0-d object array around it)."""
    value = saved.item() if saved.dtype == object and saved.shape == () else saved
    if not isinstance(value, dict):
        raise BadRow(f"{path.name}: holds {_kind(value)}, expected a dict (np.save of the "
                     f"extractor's info)")
    return value


def _kind(value) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of shape {list(value.shape)} and dtype {value.dtype}"
    return f"a {type(value).__name__}"


@FORMATS.register("mmf-lmdb")
class MmfLmdb(FeatureFormat):
    """MMF's lmdb_conversion.py LMDB: pickled dicts of features, bbox, objects, image size"""

    name = "mmf-lmdb"

    def units(self, sources: list[Path]) -> list[Path]:
        return existing(sources, "MMF LMDB")

    def content(self, unit: Path) -> list[Path]:
        return [data_file(unit)]

    def steps(self, unit: Path, start) -> Iterator[Step]:
        def decode(key: str, value: bytes, where: str) -> Record:
            item = readable(safe_pickle.loads, value, where)
            if not isinstance(item, dict) or "features" not in item:
                raise BadRow("value is not a dict with 'features'")
            return mmf_record(item["features"], item)

        return lmdb_steps(unit, start, decode, skip=(b"keys",))

    def producer(self, units: list[Path]) -> dict:
        return {"layout": "facebookresearch/mmf tools/scripts/features/lmdb_conversion.py"}
