"""Fingerprints: one short name for everything that determines a set of features.

Two extractions with equal fingerprints produce the same features, so a store
is named by its fingerprint and shared: a second experiment, or a second
stages file, asking for the same features reuses it. The settings hashed are
the extractor's, the weights' content hash (or "random" with its seed), and
the dataset's images: ids, paths and file contents.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pipeline.captions.karpathy import KarpathyDataset
from pipeline.core.hashing import HashCache, NotARegularFile


def fingerprint(settings: dict) -> str:
    """16 hex digits of the md5 of the settings' canonical JSON."""
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.md5(canonical.encode()).hexdigest()[:16]


def images_digest(dataset: KarpathyDataset, image_root: str | Path, hashes: HashCache) -> str:
    """md5 over every image's id, relative path and content ("missing" when absent, "not a
    regular file" for a FIFO, device or folder: never read, since it may never end)."""
    h = hashlib.md5()
    root = Path(image_root)
    for im in dataset.images:
        path = root / im.relpath
        try:
            content = hashes.file_md5(path)
        except NotARegularFile:
            content = "not a regular file"
        except OSError:
            content = "missing"
        h.update(f"{im.image_id}\0{im.relpath}\0{content}\n".encode())
    return h.hexdigest()
