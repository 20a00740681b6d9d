"""The prepared captions, as the trainer and the CIDEr-D cache read them back.

``capstack prepare`` (prepare.py) writes a folder; :func:`load_captions` reads
it: the vocabulary, every caption's word ids, each image's caption rows, the
image ids and splits, and where each split's COCO-format references are.

The folder carries the md5 of every file prepare wrote (``checksums.json``,
:func:`write_checksums`), checked each time it is read: a damaged or edited file
is named. A folder written before checksums has none and loads as before. Either
way ``captions.h5`` must fit itself and the vocabulary (word ids below its size,
caption rows within the file): :func:`check_captions`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import h5py
import numpy as np

from pipeline.captions.vocab import Vocabulary
from pipeline.core.errors import CapstackError
from pipeline.core.hashing import md5_of_file

SPLIT_CODES = {"train": 0, "val": 1, "test": 2}
LEFT_OUT = 255  # the split code of an image no split uses (codes are uint8)
CHECKSUMS = "checksums.json"  # {"md5": {file name: md5}} of the files prepare wrote


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
    verify_checksums(folder)
    try:
        with h5py.File(h5_path, "r") as f:
            arrays = {k: f[k][()] for k in ("labels", "lengths", "label_start", "label_end",
                                            "image_ids", "split")}
    except (OSError, KeyError) as error:
        raise CapstackError(f"{h5_path}: not a prepared captions file ({error})") from None
    captions = Captions(folder, Vocabulary.load(vocab_path), **arrays)
    check_captions(captions, h5_path)
    return captions


def write_checksums(folder: Path) -> None:
    """Record the md5 of every file in ``folder`` (what prepare wrote), in CHECKSUMS."""
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != CHECKSUMS)
    (folder / CHECKSUMS).write_text(json.dumps(
        {"md5": {name: md5_of_file(folder / name) for name in files}}, indent=1))


def verify_checksums(folder: Path) -> None:
    """Refuse a file of the folder whose md5 is not the one prepare recorded, naming it; a
    folder written before checksums (no CHECKSUMS) passes. The files are small: hashed."""
    path = folder / CHECKSUMS
    if not path.is_file():
        return
    try:
        recorded = json.loads(path.read_text())["md5"]
        if not isinstance(recorded, dict) or not all(
                isinstance(name, str) and isinstance(md5, str) and name == Path(name).name
                and name not in ("", ".", "..") for name, md5 in recorded.items()):
            raise ValueError("not {file name: md5}")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CapstackError(f"{path}: damaged (not the {{\"md5\": {{file: md5}}}} that "
                            f"`capstack prepare` writes: {error}); run `capstack prepare` "
                            f"again") from None
    for name, md5 in sorted(recorded.items()):
        file = folder / name
        if not file.is_file():
            raise CapstackError(f"{file}: missing, though {CHECKSUMS} lists it; run `capstack "
                                f"prepare` again")
        if md5_of_file(file) != md5:
            raise CapstackError(f"{file}: damaged: its content does not match the md5 that "
                                f"`capstack prepare` recorded in {CHECKSUMS} (edited, or "
                                f"flipped bytes); run `capstack prepare` again")


def check_captions(c: Captions, where: Path) -> None:
    """Refuse captions that do not fit the vocabulary or themselves, naming the first bad
    entry (``labels[1234] holds word id 9000, the vocabulary has 500 words``): the trainer
    would fail on them with an IndexError far from the file."""
    for name in ("labels", "lengths", "label_start", "label_end", "image_ids", "split"):
        array = getattr(c, name)
        if not np.issubdtype(array.dtype, np.integer):
            raise CapstackError(f"{where}: {name} holds {array.dtype}, not integers")
    if c.labels.ndim != 2:
        raise CapstackError(f"{where}: labels has {c.labels.ndim} dimensions, not 2 "
                            f"(captions, max_len)")
    rows, width = c.labels.shape
    images = len(c.image_ids)
    for name, n, of in (("lengths", rows, f"labels has {rows} rows"),
                        ("label_start", images, f"image_ids has {images}"),
                        ("label_end", images, f"image_ids has {images}"),
                        ("split", images, f"image_ids has {images}")):
        array = getattr(c, name)
        if array.shape != (n,):
            raise CapstackError(f"{where}: {name} has {array.size} entries, {of}")
    bad = (c.labels < 0) | (c.labels >= len(c.vocab))
    if bad.any():
        row = int(bad.any(axis=1).argmax())
        word = int(c.labels[row][bad[row]][0])
        raise CapstackError(f"{where}: labels[{row}] holds word id {word}, the vocabulary has "
                            f"{len(c.vocab)} words")
    _first(where, "lengths", c.lengths, (c.lengths < 0) | (c.lengths > width),
           f"outside 0..{width} (the labels' width)")
    _first(where, "label_start", c.label_start, c.label_start < 0, "before the first caption row")
    _first(where, "label_end", c.label_end, c.label_end > rows, f"past the {rows} caption rows")
    after = c.label_start > c.label_end
    if after.any():
        i = int(after.argmax())
        raise CapstackError(f"{where}: label_start[{i}] is {c.label_start[i]}, after "
                            f"label_end[{i}] ({c.label_end[i]})")
    _first(where, "split", c.split, ~np.isin(c.split, list(SPLIT_CODES.values())),
           "not a split code (" + ", ".join(f"{v} {k}" for k, v in SPLIT_CODES.items()) + ")")


def _first(where: Path, name: str, array: np.ndarray, bad: np.ndarray, why: str) -> None:
    if bad.any():
        i = int(bad.argmax())
        raise CapstackError(f"{where}: {name}[{i}] is {array[i]}, {why}")
