"""The prepared captions, as the trainer and the CIDEr-D cache read them back.

``capstack prepare`` (prepare.py) writes a folder; :func:`load_captions` reads
it: the vocabulary, every caption's word ids, each image's caption rows, the
image ids and splits, and where each split's COCO-format references are.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import h5py
import numpy as np

from pipeline.captions.vocab import Vocabulary
from pipeline.core.errors import CapstackError

SPLIT_CODES = {"train": 0, "val": 1, "test": 2}
LEFT_OUT = 255  # the split code of an image no split uses (codes are uint8)


@dataclass
class Captions:
    """What ``capstack prepare`` wrote: vocabulary, caption rows per image, references."""

    folder: Path
    vocab: Vocabulary
    labels: np.ndarray  # [captions, max_len] int32, 0-padded
    lengths: np.ndarray  # [captions]
    label_start: np.ndarray  # [images] first caption row
    label_end: np.ndarray  # [images] one past the last
    image_ids: np.ndarray  # [images]
    split: np.ndarray  # [images] 0 train, 1 val, 2 test

    def rows(self, split: str) -> np.ndarray:
        return np.flatnonzero(self.split == SPLIT_CODES[split])

    def without(self, image_ids) -> "Captions":
        """These captions with ``image_ids`` in no split (e.g. images a store had to skip)."""
        split = self.split.copy()
        split[np.isin(self.image_ids, np.asarray(list(image_ids), np.int64))] = LEFT_OUT
        return replace(self, split=split)

    def references_path(self, split: str) -> Path:
        return self.folder / f"refs_{split}.json"


def load_captions(folder: str | Path) -> Captions:
    folder = Path(folder)
    vocab_path, h5_path = folder / "vocab.json", folder / "captions.h5"
    for path in (vocab_path, h5_path):
        if not path.is_file():
            raise CapstackError(f"{path}: not found (run `capstack prepare` to write {folder})")
    try:
        with h5py.File(h5_path, "r") as f:
            arrays = {k: f[k][()] for k in ("labels", "lengths", "label_start", "label_end",
                                            "image_ids", "split")}
    except (OSError, KeyError) as error:
        raise CapstackError(f"{h5_path}: not a prepared captions file ({error})") from None
    return Captions(folder, Vocabulary.load(vocab_path), **arrays)
