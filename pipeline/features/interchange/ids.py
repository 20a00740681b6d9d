"""A source's names for images -> the dataset's image ids.

Sources name an image by its COCO id (BUTD's ``image_id`` column, ruotianluo's
``<cocoid>.npz``, meshed-memory's ``<id>_features``), by its file's stem
(MILVLG's ``COCO_val2014_000000391895.npz``, MMF's keys, every Flickr id, since
Flickr's stems are its photo ids) or by a name with the id at the end. The
rule ``auto`` tries, in order: the stem of the dataset's file name, the
dataset's image id, the number that ends the name; ``stem`` and ``id`` use only
the one. Numeric stems (Flickr's ``1000092795.jpg``) match before ids, so
Flickr's photo ids are never mistaken for its 0-based Karpathy ids.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import PurePosixPath

from pipeline.captions.karpathy import KarpathyDataset
from pipeline.core.errors import CapstackError

RULES = ("auto", "stem", "id")
_TRAILING_NUMBER = re.compile(r"([0-9]+)$")  # ASCII digits: "²".isdigit() is true


class ImageMatcher:
    def __init__(self, dataset: KarpathyDataset, rule: str = "auto"):
        if rule not in RULES:
            raise CapstackError(f"--match: expected one of {', '.join(RULES)}, got {rule!r}")
        self.rule = rule
        self.ids = {im.image_id for im in dataset.images}
        self.stems = {PurePosixPath(im.filename).stem: im.image_id for im in dataset.images}

    def __call__(self, key: str) -> int | None:
        """The dataset image ``key`` names, or None."""
        key = PurePosixPath(key.strip()).stem if "/" in key else key.strip()
        if self.rule in ("auto", "stem") and key in self.stems:
            return self.stems[key]
        if self.rule == "stem":
            return None
        number = key if key.isascii() and key.isdigit() else None
        if number is None and self.rule == "auto":
            found = _TRAILING_NUMBER.search(key)
            number = found.group(1) if found else None
        if number is not None and int(number) in self.ids:
            return int(number)
        return None


def dataset_digest(dataset: KarpathyDataset) -> str:
    """md5 of the dataset's (image id, file name) pairs: what an import's records depend on."""
    h = hashlib.md5()
    for im in dataset.images:
        h.update(f"{im.image_id}\0{im.filename}\n".encode())
    return h.hexdigest()
