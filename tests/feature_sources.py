"""Feature files in other toolkits' published layouts, written here from those layouts (never
through capstack's exporter), for the importers' tests."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np

from conftest import karpathy_image


def b64(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")


def region_rows(image_ids, *, dim=32, boxes=(3, 9), seed=0, size=(96, 128)) -> list[dict]:
    """One source row per id: float32 features [N, dim], pixel boxes [N, 4], the image size."""
    rng = np.random.default_rng(seed)
    rows = []
    for image_id in image_ids:
        n = int(rng.integers(boxes[0], boxes[1] + 1))
        h, w = size
        xy = rng.random((n, 2)) * [w / 2, h / 2]
        wh = 1 + rng.random((n, 2)) * [w / 2 - 1, h / 2 - 1]
        rows.append({"image_id": image_id, "image_h": h, "image_w": w,
                     "boxes": np.concatenate([xy, xy + wh], 1).astype(np.float32),
                     "features": (rng.random((n, dim)) * 4).astype(np.float32),
                     "classes": rng.integers(1, 1600, n), "scores": rng.random(n),
                     "attributes": rng.integers(1, 400, n), "attribute_scores": rng.random(n)})
    return rows


def butd_line(row: dict) -> str:
    """generate_tsv.py's FIELDNAMES order: image_id, image_w, image_h, num_boxes, boxes,
    features (float32, base64)."""
    return "\t".join([str(row["image_id"]), str(row["image_w"]), str(row["image_h"]),
                      str(len(row["boxes"])), b64(row["boxes"]), b64(row["features"])]) + "\n"


def undecodable_line(row: dict) -> str:
    """``row``'s BUTD line with its features' base64 one character short, as in the test2014
    files users report ("Incorrect padding")."""
    columns = butd_line(row).rstrip("\n").split("\t")
    columns[5] = columns[5][:-1]
    return "\t".join(columns) + "\n"


def write_butd_tsv(path: Path, rows: list[dict], lines: dict[int, str] | None = None) -> Path:
    """``rows`` as a BUTD TSV; ``lines`` puts a given raw line before row k (broken rows)."""
    lines = lines or {}
    with open(path, "w") as f:
        for k, row in enumerate(rows):
            if k in lines:
                f.write(lines[k])
            f.write(butd_line(row))
        if len(rows) in lines:
            f.write(lines[len(rows)])
    return path


def dataset_json(path: Path, n: int, *, first_id: int = 100, coco: bool = True) -> Path:
    """A Karpathy json of ``n`` images (COCO ids from ``first_id``, or Flickr-style stems)."""
    images = []
    for k in range(n):
        split = "train" if k < n - 4 else ("val" if k < n - 2 else "test")
        if coco:
            image = karpathy_image(k, split, ["a red circle", "a blue square"],
                                   cocoid=first_id + k, filepath="val2014",
                                   filename=f"COCO_val2014_{first_id + k:012d}.jpg")
        else:
            image = karpathy_image(k, split, ["a red circle", "a blue square"],
                                   filename=f"{1000000 + k}.jpg")
        images.append(image)
    path.write_text(json.dumps({"dataset": "coco" if coco else "flickr30k", "images": images}))
    return path
