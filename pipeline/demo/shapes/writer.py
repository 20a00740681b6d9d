"""Writing the shapes dataset in the Karpathy format of ``dataset_coco.json``.

``OUT_DIR/images/shapes_{imgid:06d}.png`` and ``OUT_DIR/dataset_shapes.json``.
Beside the Karpathy fields every image carries ``boxes``, one entry per object::

    {"box": [x1, y1, x2, y2], "label": "circle", "shape": "circle", "color": "red", "size": "small"}

where the box is in image pixels, inclusive-exclusive (the object covers columns
x1..x2-1 and rows y1..y2-1) and fits the drawn pixels exactly. Image ``imgid`` is
drawn from its own generator seeded by ``(seed, imgid)``: the same arguments give
the same bytes, and an image's content does not depend on the split sizes (only
which split it falls in does). Images are numbered train first, then val, then test.

``captions`` picks the caption style: ``"grammar"`` (the default; ``captions``) or
``"free"`` (``free_captions``: freer word order and more synonyms). Free captions are
drawn from a second generator seeded by ``(seed, imgid, FREE_STREAM)``, so the images,
ids, splits, file names and boxes are byte for byte those of the default style and
only the sentences differ (feature stores, named by the images, serve both). A free
dataset says so in its json: ``"caption_style": "free"`` beside ``"dataset"``; the
default one's json is as it always was.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from .captions import CAPTIONS_PER_IMAGE, captions_for
from .draw import render
from .free_captions import free_captions_for
from .scene import Scene, sample_scene
from pipeline.captions.karpathy import tokenize
from pipeline.core.atomic import atomic_dir
from pipeline.core.errors import CapstackError

MIN_SIZE = 32
JSON_NAME = "dataset_shapes.json"
IMAGE_FOLDER = "images"
CAPTION_STYLES = ("grammar", "free")
FREE_STREAM = int.from_bytes(b"free", "big")  # the third word of the free captions' seed
WRITER = "shapes"  # the command whose output folder this is (its marker says so)


@dataclass(frozen=True)
class Example:
    """One image of the dataset: what it shows, how it looks, what is said about it."""

    scene: Scene
    image: Image.Image
    boxes: list[list[int]]
    captions: list[str]


def make_example(seed: int, imgid: int, size: int, captions: str = "grammar") -> Example:
    """Image ``imgid`` of the dataset drawn with ``seed``; depends on nothing else.

    The scene comes first from the image's generator; the default captions follow from
    the same generator, free ones from their own, so the scene is the same in both."""
    rng = np.random.default_rng([seed, imgid])
    scene = sample_scene(rng, size)
    if captions == "free":
        texts = free_captions_for(scene, np.random.default_rng([seed, imgid, FREE_STREAM]),
                                  CAPTIONS_PER_IMAGE)
    else:
        texts = captions_for(scene, rng, CAPTIONS_PER_IMAGE)
    image, boxes = render(scene)
    return Example(scene, image, boxes, texts)


def image_filename(imgid: int) -> str:
    return f"shapes_{imgid:06d}.png"


def image_record(imgid: int, split: str, example: Example) -> dict:
    """One image's entry in the Karpathy json; sentence ids are ``imgid * 5 + k``."""
    sentids = [imgid * CAPTIONS_PER_IMAGE + k for k in range(len(example.captions))]
    return {
        "filepath": IMAGE_FOLDER,
        "filename": image_filename(imgid),
        "imgid": imgid,
        "split": split,
        "sentids": sentids,
        "sentences": [{"tokens": list(tokenize(raw)), "raw": raw, "imgid": imgid, "sentid": sid}
                      for raw, sid in zip(example.captions, sentids)],
        "boxes": [{"box": box, "label": obj.shape, "shape": obj.shape, "color": obj.color,
                   "size": obj.size}
                  for obj, box in zip(example.scene.objects, example.boxes)],
    }


def check_arguments(n_train, n_val, n_test, seed, size, captions="grammar") -> None:
    """Raise :class:`CapstackError` naming the bad option."""
    if captions not in CAPTION_STYLES:
        raise CapstackError(f"shapes: --captions must be one of {', '.join(CAPTION_STYLES)}, "
                            f"got {captions!r}")
    for option, value in (("--train", n_train), ("--val", n_val), ("--test", n_test),
                          ("--seed", seed), ("--size", size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise CapstackError(f"shapes: {option} must be an integer, got {value!r}")
    for option, value in (("--train", n_train), ("--val", n_val), ("--test", n_test),
                          ("--seed", seed)):
        if value < 0:
            raise CapstackError(f"shapes: {option} must be >= 0, got {value}")
    if n_train + n_val + n_test < 1:
        raise CapstackError("shapes: at least one image is needed, but --train, --val and "
                            "--test are all 0")
    if size < MIN_SIZE:
        raise CapstackError(f"shapes: --size must be at least {MIN_SIZE}, got {size}")


def split_plan(n_train: int, n_val: int, n_test: int) -> list[str]:
    """The split of each imgid: train first, then val, then test."""
    return ["train"] * n_train + ["val"] * n_val + ["test"] * n_test


def write_shapes_dataset(out_dir, n_train: int = 3000, n_val: int = 250, n_test: int = 250,
                         seed: int = 0, size: int = 128, progress: bool = True,
                         force: bool = False, captions: str = "grammar") -> dict:
    """Draw the dataset into ``out_dir``, which appears whole (replacing an older one that
    capstack wrote, or any with ``force``) or not at all. ``captions``: "grammar" or "free".

    Returns ``{"json": path, "images": n, "splits": {"train": .., "val": .., "test": ..},
    "captions": n, "caption_style": captions, "words": distinct words over all captions}``.
    """
    check_arguments(n_train, n_val, n_test, seed, size, captions)
    seed, size = int(seed), int(size)
    splits = split_plan(n_train, n_val, n_test)
    out_dir = Path(out_dir)
    records = []
    with atomic_dir(out_dir, WRITER, force=force) as tmp:
        images = tmp / IMAGE_FOLDER
        images.mkdir()
        for imgid, split in enumerate(tqdm(splits, desc="shapes", unit="img", file=sys.stderr,
                                           disable=not progress)):
            example = make_example(seed, imgid, size, captions)
            example.image.save(images / image_filename(imgid), format="PNG")
            records.append(image_record(imgid, split, example))
        dataset = {"dataset": "shapes", "images": records}
        if captions != "grammar":  # the default's json stays as it was
            dataset = {"dataset": "shapes", "caption_style": captions, "images": records}
        (tmp / JSON_NAME).write_text(json.dumps(dataset), encoding="utf-8")
    return {
        "json": str(out_dir / JSON_NAME),
        "images": len(records),
        "splits": {"train": n_train, "val": n_val, "test": n_test},
        "captions": sum(len(r["sentences"]) for r in records),
        "caption_style": captions,
        "words": len({t for r in records for s in r["sentences"] for t in s["tokens"]}),
    }
