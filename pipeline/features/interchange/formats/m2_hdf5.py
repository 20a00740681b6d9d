"""``m2-hdf5``: aimagelab/meshed-memory-transformer's ``coco_detections.hdf5``.

One HDF5 file, three datasets per image at its root: ``<id>_features``
``[N, 2048]``, ``<id>_boxes`` ``[N, 4]`` (x1, y1, x2, y2 in image pixels) and
``<id>_cls_prob`` ``[N, 1601]`` (Visual Genome's classes, background first).
A region's class is the most probable non-background class (1-based, as the
file's class list counts it) and its score that probability. The file records
no image size: ``--image-root`` reads it from the images.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Iterator

import numpy as np

from pipeline.core.errors import CapstackError
from pipeline.features.interchange.formats import FORMATS
from pipeline.features.interchange.formats.base import (BadRow, FeatureFormat, SourceRow, Step,
                                                        bounded, existing)
from pipeline.features.stores import Record

SUFFIX = "_features"


def _open(path: Path):
    import h5py
    try:
        return h5py.File(path, "r")
    except OSError as error:
        raise CapstackError(f"{path}: not an HDF5 file ({error})") from None


def m2_record(f, key: str) -> Record:
    features = _array(f, f"{key}{SUFFIX}")
    assert features is not None, "a required dataset is read or refused"
    if features.ndim != 2:
        raise BadRow(f"{key}{SUFFIX} of shape {list(features.shape)}, expected [N, D]")
    n, fields = features.shape[0], {}
    boxes = _array(f, f"{key}_boxes", required=False)
    if boxes is not None:
        if boxes.shape != (n, 4):
            raise BadRow(f"{key}_boxes of shape {list(boxes.shape)} for {n} rows")
        fields["boxes"] = boxes
    prob = _array(f, f"{key}_cls_prob", required=False)
    if prob is not None:
        if prob.ndim != 2 or prob.shape[0] != n or prob.shape[1] < 2:
            raise BadRow(f"{key}_cls_prob of shape {list(prob.shape)} for {n} rows")
        fields["classes"] = prob[:, 1:].argmax(1) + 1
        fields["scores"] = prob[:, 1:].max(1)
    return Record(features, 0, 0, **fields)


def _array(f, name: str, required: bool = True) -> np.ndarray | None:
    """Dataset ``name`` of the file's root, read only when it is one: a numeric dataset stored
    in this file (a link elsewhere, even to another file, is not followed) whose declared
    shape is within a row's bound."""
    import h5py

    link = f.get(name, getlink=True)
    if link is None:
        if required:
            raise BadRow(f"no dataset {name}")
        return None
    if not isinstance(link, h5py.HardLink):
        raise BadRow(f"{name}: a {type(link).__name__}, not followed (only datasets stored in "
                     f"this file are read)")
    node = f[name]
    if not isinstance(node, h5py.Dataset):
        raise BadRow(f"{name}: a {type(node).__name__.lower()}, expected a dataset")
    if node.dtype.kind not in "biuf":
        raise BadRow(f"{name}: values of dtype {node.dtype} are not numbers")
    bounded(node.shape, node.dtype.itemsize, name)
    return np.asarray(node[()])


def _nbytes(f, name: str) -> int:
    """What the row's features take (the progress bar's unit); 0 for what is no dataset."""
    import h5py

    node = f.get(name, getlink=True)
    if not isinstance(node, h5py.HardLink):
        return 0
    return int(getattr(f[name], "nbytes", 0) or 0)


@FORMATS.register("m2-hdf5")
class M2Hdf5(FeatureFormat):
    """meshed-memory-transformer's coco_detections.hdf5 (<id>_features, _boxes, _cls_prob)"""

    name = "m2-hdf5"
    records_sizes = False

    def units(self, sources: list[Path]) -> list[Path]:
        return existing(sources, "HDF5 file")

    def steps(self, unit: Path, start) -> Iterator[Step]:
        with _open(unit) as f:
            keys = sorted(name[:-len(SUFFIX)] for name in f.keys() if name.endswith(SUFFIX))
            for index in range(int(start or 0), len(keys)):
                key, where = keys[index], f"{unit}[{keys[index]}{SUFFIX}]"
                size = _nbytes(f, f"{key}{SUFFIX}")
                yield Step(index + 1, size, SourceRow(key, where, partial(m2_record, f, key)))

    def producer(self, units: list[Path]) -> dict:
        return {"layout": "aimagelab/meshed-memory-transformer coco_detections.hdf5",
                "classes": "1-based over Visual Genome's 1600 classes (argmax of cls_prob[:, 1:])"}
