"""``m2-hdf5``: aimagelab/meshed-memory-transformer's ``coco_detections.hdf5``.

One HDF5 file, three datasets per image at its root: ``<id>_features``
``[N, 2048]``, ``<id>_boxes`` ``[N, 4]`` (x1, y1, x2, y2 in image pixels) and
``<id>_cls_prob`` ``[N, 1601]`` (Visual Genome's classes, background first).
A region's class is the most probable non-background class (1-based, as the
file's class list counts it) and its score that probability. The file records
no image size: ``--image-root`` reads it from the images.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from pipeline.core.errors import CapstackError
from pipeline.features.interchange.formats import FORMATS
from pipeline.features.interchange.formats.base import (BadRow, FeatureFormat, SourceRow, Step,
                                                        existing)
from pipeline.features.stores import Record

SUFFIX = "_features"


def _open(path: Path):
    import h5py
    try:
        return h5py.File(path, "r")
    except OSError as error:
        raise CapstackError(f"{path}: not an HDF5 file ({error})") from None


def m2_record(f, key: str) -> Record:
    features = np.asarray(f[f"{key}{SUFFIX}"][()])
    if features.ndim != 2:
        raise BadRow(f"{key}{SUFFIX} of shape {list(features.shape)}, expected [N, D]")
    n, fields = features.shape[0], {}
    if f"{key}_boxes" in f:
        fields["boxes"] = np.asarray(f[f"{key}_boxes"][()])
        if fields["boxes"].shape != (n, 4):
            raise BadRow(f"{key}_boxes of shape {list(fields['boxes'].shape)} for {n} rows")
    if f"{key}_cls_prob" in f:
        prob = np.asarray(f[f"{key}_cls_prob"][()])
        if prob.ndim != 2 or prob.shape[0] != n or prob.shape[1] < 2:
            raise BadRow(f"{key}_cls_prob of shape {list(prob.shape)} for {n} rows")
        fields["classes"] = prob[:, 1:].argmax(1) + 1
        fields["scores"] = prob[:, 1:].max(1)
    return Record(features, 0, 0, **fields)


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
                size = f[f"{key}{SUFFIX}"].nbytes
                yield Step(index + 1, size, SourceRow(key, where, lambda k=key: m2_record(f, k)))

    def producer(self, units: list[Path]) -> dict:
        return {"layout": "aimagelab/meshed-memory-transformer coco_detections.hdf5",
                "classes": "1-based over Visual Genome's 1600 classes (argmax of cls_prob[:, 1:])"}
