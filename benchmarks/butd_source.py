"""Write a bottom-up-attention TSV source for a Karpathy dataset: what importing looks like
before you have the real files (random features, the layout of the real ones).

The files follow ``tools/generate_tsv.py``: headerless ``\\r\\n`` lines of
``image_id, image_w, image_h, num_boxes, boxes, features`` (float32, base64),
adaptive box counts, split in ``--parts`` files named like the trainval
release (``trainval_resnet101_faster_rcnn_genome.tsv.0`` ...). ``--undecodable
N`` cuts N rows' features base64 short, as in the test2014 files users report
("Incorrect padding"). Image sizes come from the images under ``--image-root``
when given (else 480 x 640). The features are random: a decoder trained on them
learns the captions' language, not the images.

    python benchmarks/butd_source.py data/shapes/dataset_shapes.json /tmp/butd \\
        --image-root data/shapes --boxes 10-36 --dim 2048 --parts 2 --undecodable 3
"""

from __future__ import annotations

import argparse
import base64
from pathlib import Path

import numpy as np

import common  # this checkout importable  # noqa: F401

from pipeline.captions.karpathy import load_karpathy

NAME = "trainval_resnet101_faster_rcnn_genome.tsv"


def b64(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array, np.float32).tobytes()).decode("ascii")


def image_size(path: Path | None) -> tuple[int, int]:
    if path is None:
        return 480, 640
    from PIL import Image
    with Image.open(path) as image:
        return image.height, image.width


def write_source(dataset_json: Path, out: Path, *, boxes: tuple[int, int], dim: int, parts: int,
                 undecodable: int, image_root: Path | None, seed: int = 0) -> list[Path]:
    images = load_karpathy(dataset_json).images
    rng = np.random.default_rng(seed)
    broken = set(rng.choice(len(images), min(undecodable, len(images)), replace=False).tolist())
    out.mkdir(parents=True, exist_ok=True)
    files = [out / f"{NAME}.{k}" for k in range(parts)]
    handles = [open(f, "w", newline="") for f in files]
    try:
        for k, im in enumerate(images):
            h, w = image_size(image_root / im.relpath if image_root else None)
            n = int(rng.integers(boxes[0], boxes[1] + 1))
            xy = rng.random((n, 2)) * [w * 0.8, h * 0.8]
            size = 1 + rng.random((n, 2)) * [w * 0.2, h * 0.2]
            box = np.concatenate([xy, xy + size], 1)
            features = b64(np.maximum(rng.standard_normal((n, dim)), 0))
            if k in broken:
                features = features[:-1]
            handles[k % parts].write(f"{im.image_id}\t{w}\t{h}\t{n}\t{b64(box)}\t{features}\r\n")
    finally:
        for handle in handles:
            handle.close()
    return files


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset_json", type=Path)
    parser.add_argument("out", type=Path, help="Folder for the TSV parts.")
    parser.add_argument("--image-root", type=Path, default=None)
    parser.add_argument("--boxes", default="10-100", help="MIN-MAX boxes per image.")
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--parts", type=int, default=2)
    parser.add_argument("--undecodable", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    low, high = (int(x) for x in args.boxes.split("-"))
    files = write_source(args.dataset_json, args.out, boxes=(low, high), dim=args.dim,
                         parts=args.parts, undecodable=args.undecodable,
                         image_root=args.image_root, seed=args.seed)
    size = sum(f.stat().st_size for f in files) / 2**20
    print(f"butd_source: {len(files)} parts, {size:.0f} MB -> {args.out}")


if __name__ == "__main__":
    main()
