"""Reading Karpathy-format caption files (COCO, Flickr8k, Flickr30k, shapes).

The format of Karpathy's ``dataset_coco.json``::

    {"dataset": "coco", "images": [{"filepath": "val2014", "filename": "COCO_val2014_...jpg",
      "imgid": 0, "cocoid": 391895, "split": "test", "sentids": [0, ...],
      "sentences": [{"tokens": ["a", "man"], "raw": "A man ...", "imgid": 0, "sentid": 0}]}]}

Flickr8k/30k images have no ``filepath`` and no ``cocoid``. An image's id (the
name it has in feature stores and COCO-format references) is ``cocoid`` when
present, else ``imgid``. Every problem raises :class:`CapstackError` naming the
file, the image and the field.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pipeline.core.bulk import gc_paused
from pipeline.core.errors import CapstackError, shown
from pipeline.core.jsonfile import read_json

SPLITS = ("train", "restval", "val", "test")
_NOT_WORD = re.compile(r"[^a-z0-9 ]")


def tokenize(raw: str) -> tuple[str, ...]:
    """Karpathy's tokenization: lowercase, drop everything but letters, digits and spaces."""
    return tuple(_NOT_WORD.sub("", raw.lower().replace("\t", " ").replace("\n", " ")).split())


@dataclass(frozen=True)
class Sentence:
    tokens: tuple[str, ...]
    raw: str
    sentid: int


@dataclass(frozen=True)
class KarpathyImage:
    index: int  # position in the file
    image_id: int
    imgid: int
    split: str  # train, restval, val or test
    filepath: str
    filename: str
    sentences: tuple[Sentence, ...]
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def relpath(self) -> str:
        """Where the image lies below the image root."""
        return f"{self.filepath}/{self.filename}" if self.filepath else self.filename


@dataclass(frozen=True)
class KarpathyDataset:
    path: Path
    name: str
    images: tuple[KarpathyImage, ...]

    def split(self, name: str) -> list[KarpathyImage]:
        """Images of a split; ``train`` includes ``restval``."""
        wanted = ("train", "restval") if name == "train" else (name,)
        return [im for im in self.images if im.split in wanted]


MAX_ID = 2 ** 63 - 1  # image ids key feature stores as int64
_KNOWN_IMAGE_KEYS = {"filepath", "filename", "imgid", "cocoid", "split", "sentids", "sentences"}


def load_karpathy(path: str | Path, *, images_inside_root: bool = True) -> KarpathyDataset:
    """Read and validate a Karpathy-format json.

    With ``images_inside_root`` (what every command that opens the images asks,
    unless the user passes ``--images-outside-root``), an image whose
    ``filepath``/``filename`` is absolute or climbs out with ``..`` is refused: a
    dataset file from elsewhere must not make capstack read ``/etc/passwd``."""
    path = Path(path)
    data = read_json(path, "dataset json")
    images_raw = data.get("images") if isinstance(data, dict) else None
    if not isinstance(images_raw, list):
        raise CapstackError(f'{path}: missing top-level "images" list')
    if not images_raw:
        raise CapstackError(f'{path}: "images" is empty')
    with gc_paused():  # a sentence object per caption: 616,767 for COCO (bulk.py)
        images = tuple(_parse_image(path, i, raw) for i, raw in enumerate(images_raw))
    _check_unique_ids(path, images)
    if images_inside_root:
        _check_inside_root(path, images)
    return KarpathyDataset(path=path, name=str(data.get("dataset", path.stem)), images=images)


MAX_COORDINATE = 2 ** 24  # pixels: far past any image's side, and exact in float32


def image_box(path: Path, im: KarpathyImage, k: int, entry: Any) -> tuple[float, ...]:
    """Box ``k`` of an image's ``boxes`` field (``[x1, y1, x2, y2]``, or ``{"box": [...]}``),
    in pixels: four finite numbers with x2 > x1 and y2 > y1, else refused naming the file,
    the image and the box. A box with NaN or its corners swapped trains a detector to NaN
    weights, which then find nothing, so every command reading boxes checks them here."""
    where = f"{path}: images[{im.index}] (imgid {im.imgid}).boxes[{k}]"
    box = entry.get("box") if isinstance(entry, dict) else entry
    if not (isinstance(box, list) and len(box) == 4 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in box)):
        raise CapstackError(f"{where}: expected [x1, y1, x2, y2] (four numbers; boxes is a "
                            f"list of them), got {shown(box)}")
    if not all(abs(v) <= MAX_COORDINATE for v in box):  # NaN and infinity are not either
        raise CapstackError(f"{where}: {shown(box)} holds a value that is not a finite number "
                            f"within {MAX_COORDINATE} pixels of the corner")
    x1, y1, x2, y2 = (float(v) for v in box)
    if not (x2 > x1 and y2 > y1):
        raise CapstackError(f"{where}: {shown(box)}: expected x2 > x1 and y2 > y1 (a box is "
                            f"[x1, y1, x2, y2], its top left corner then its bottom right)")
    return x1, y1, x2, y2


def _check_inside_root(path: Path, images) -> None:
    for im in images:
        relpath = PurePosixPath(im.relpath)
        if relpath.is_absolute() or os.pardir in relpath.parts:
            raise CapstackError(
                f"{path}: images[{im.index}] (imgid {im.imgid}): {im.relpath!r} leaves the "
                f"image root; images are read only below it unless you pass "
                f"--images-outside-root")


def _int_field(path: Path, where: str, raw: dict, key: str) -> int:
    if key not in raw:
        raise CapstackError(f'{path}: {where}: missing "{key}"')
    value = raw[key]
    if not isinstance(value, int) or isinstance(value, bool):
        raise CapstackError(f"{path}: {where}.{key}: expected an integer, got {value!r}")
    if not 0 <= value <= MAX_ID:
        raise CapstackError(f"{path}: {where}.{key}: {value} is outside 0..2**63-1 (ids are "
                            f"stored as 64-bit integers)")
    return value


def _parse_image(path: Path, index: int, raw: Any) -> KarpathyImage:
    where = f"images[{index}]"
    if not isinstance(raw, dict):
        raise CapstackError(f"{path}: {where}: expected an object")
    imgid = _int_field(path, where, raw, "imgid")
    where = f"images[{index}] (imgid {imgid})"
    for key in ("split", "sentences", "filename"):
        if key not in raw:
            raise CapstackError(f'{path}: {where}: missing "{key}"')
    split = raw["split"]
    if split not in SPLITS:
        raise CapstackError(f"{path}: {where}.split: unknown split {split!r} "
                            f"(allowed: {', '.join(SPLITS)})")
    image_id = _int_field(path, where, raw, "cocoid") if "cocoid" in raw else imgid
    sentences = raw["sentences"]
    if not isinstance(sentences, list):
        raise CapstackError(f"{path}: {where}.sentences: expected a list")
    if not sentences:
        raise CapstackError(f"{path}: {where}.sentences: no sentences")
    parsed = tuple(_parse_sentence(path, f"{where}.sentences[{k}]", s)
                   for k, s in enumerate(sentences))
    for key in ("filename", "filepath"):
        if key in raw and not isinstance(raw[key], str):
            raise CapstackError(f"{path}: {where}.{key}: expected a string")
    return KarpathyImage(
        index=index, image_id=image_id, imgid=imgid, split=split,
        filepath=raw.get("filepath", ""), filename=raw["filename"], sentences=parsed,
        extra={k: v for k, v in raw.items() if k not in _KNOWN_IMAGE_KEYS},
    )


def _parse_sentence(path: Path, where: str, raw: Any) -> Sentence:
    if not isinstance(raw, dict):
        raise CapstackError(f"{path}: {where}: expected an object")
    tokens = raw.get("tokens")
    text = raw.get("raw")
    if text is not None and not isinstance(text, str):
        raise CapstackError(f"{path}: {where}.raw: expected a string")
    if tokens is None:
        if not text:
            raise CapstackError(f'{path}: {where}: neither "tokens" nor "raw"')
        tokens = tokenize(text)
        if not tokens:
            raise CapstackError(f"{path}: {where}.raw: no words in {text!r}")
    else:
        tokens = _words(tokens)
        if tokens is None:
            raise CapstackError(f"{path}: {where}.tokens: expected a list of strings")
        if not tokens:
            raise CapstackError(f"{path}: {where}: empty tokens")
    sentid = raw.get("sentid", -1)
    if not isinstance(sentid, int) or isinstance(sentid, bool):
        raise CapstackError(f"{path}: {where}.sentid: expected an integer, got {sentid!r}")
    return Sentence(tokens=tuple(tokens), raw=text if text else " ".join(tokens), sentid=sentid)


def _words(tokens: Any) -> tuple[str, ...] | None:
    """A sentence's ``tokens`` as words: each token split at whitespace (one word a token),
    lowercased and interned (COCO's 6.5 million caption words are ~25,000 distinct ones:
    one string each, not one per occurrence); None when ``tokens`` is not a list of strings."""
    if not isinstance(tokens, list):
        return None
    try:
        joined = " ".join(tokens)  # a TypeError names anything but strings, as isinstance would
    except TypeError:
        return None
    return tuple(map(sys.intern, map(str.lower, joined.split())))


def _check_unique_ids(path: Path, images: tuple[KarpathyImage, ...]) -> None:
    seen: dict[int, int] = {}
    for im in images:
        if im.image_id in seen:
            raise CapstackError(f"{path}: images[{im.index}]: duplicate image id {im.image_id} "
                                f"(also images[{seen[im.image_id]}])")
        seen[im.image_id] = im.index
