"""Importing a BUTD TSV: capstack's import against the floor of reading and decoding the file.

A TSV of the trainval layout is generated (``--images`` images x ``--boxes``
regions x ``--dim`` float32 features, base64, in ``--parts`` files; the
defaults give about 7.9 GB, the shape of the real 23 GB trainval file at a
third of its images) with a Karpathy json naming those images. Then, with the
file in the page cache:

* the floor: a bare loop that reads each line, splits it, base64-decodes the
  boxes and features and wraps them with ``np.frombuffer`` (nothing kept),
  with the standard library's decoder and again with pybase64's (capstack's);
* capstack's import of the same files into a fresh LMDB store, run as a
  separate process (its peak resident memory is that process's alone): the
  hashing pass (first import only) and the streaming import are timed apart.

Printed: MB/s of each, ``ratio_import_to_floor`` (the target is >= 0.80;
``ratio_import_to_pybase64_floor`` compares with the faster decoder's floor),
the first import's end-to-end MB/s, and the peak memory of imports of
``--images`` and a quarter of them (flat memory: about the same).

    python benchmarks/import.py [--images 20000] [--boxes 36] [--dim 2048] [--parts 2]
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pybase64

from common import ROOT

DISTINCT_ROWS = 32  # generated once, then reused (generation is not what is measured)


def generate(folder: Path, images: int, boxes: int, dim: int, parts: int) -> tuple[list, Path]:
    rng = np.random.default_rng(0)
    blocks = []
    for _ in range(DISTINCT_ROWS):
        xy = rng.random((boxes, 2), dtype=np.float32) * 300
        box = np.concatenate([xy, xy + 50], 1).astype(np.float32)
        feat = (rng.random((boxes, dim), dtype=np.float32) * 8).astype(np.float32)
        blocks.append(f"{boxes}\t{base64.b64encode(box.tobytes()).decode()}\t"
                      f"{base64.b64encode(feat.tobytes()).decode()}\r\n")
    ids = list(range(1, images + 1))
    files = [folder / f"trainval_resnet101_faster_rcnn_genome_{boxes}.tsv.{k}"
             for k in range(parts)]
    for k, path in enumerate(files):
        with open(path, "w", newline="") as f:
            for i in ids[k::parts]:
                f.write(f"{i}\t640\t480\t{blocks[i % DISTINCT_ROWS]}")
    images_json = [{"filepath": "train2014", "filename": f"COCO_train2014_{i:012d}.jpg",
                    "imgid": i - 1, "cocoid": i, "split": "train", "sentids": [i],
                    "sentences": [{"tokens": ["a", "b"], "raw": "A b.", "imgid": i - 1,
                                   "sentid": i}]} for i in ids]
    dataset = folder / "dataset_coco.json"
    dataset.write_text(json.dumps({"dataset": "coco", "images": images_json}))
    return files, dataset


def floor(files: list[Path], decode=binascii.a2b_base64) -> tuple[float, int]:
    """Seconds and bytes of the bare read + split + base64 decode + frombuffer loop."""
    nbytes, started = 0, time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=1 << 22) as f:
            for line in f:
                nbytes += len(line)
                parts = line.split(b"\t")
                np.frombuffer(decode(parts[4]), np.float32)
                np.frombuffer(decode(parts[5]), np.float32)
    return time.perf_counter() - started, nbytes


def simd_decode(text: bytes) -> bytes:
    return pybase64.b64decode(text.rstrip(b"\r\n"), validate=True)


IMPORT_SCRIPT = """
import json, resource, sys, time
from pathlib import Path
from pipeline.features.interchange import importer
files, dataset, store_root = json.loads(sys.argv[1])
job = importer.ImportJob("butd-tsv", [Path(f) for f in files], Path(dataset), root=Path(store_root))
started = time.perf_counter()
result = importer.import_features(job, progress=False)
total = time.perf_counter() - started
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
print(json.dumps({"total_s": total, "import_s": result.seconds, "bytes": result.nbytes,
                  "imported": result.report.imported,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "heap_mb": int(status["RssAnon"].split()[0]) / 1024}))
"""


def capstack_import(files: list[Path], dataset: Path, store_root: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", IMPORT_SCRIPT,
                          json.dumps([[str(f.resolve()) for f in files], str(dataset.resolve()),
                                      str(store_root.resolve())])],
                         check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--boxes", type=int, default=36)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--parts", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="Where the generated TSV and stores go [a temporary folder].")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="capstack-import-", dir=args.workdir))
    try:
        small = work / "quarter"
        small.mkdir()
        files_small, dataset_small = generate(small, args.images // 4, args.boxes, args.dim,
                                              args.parts)
        files, dataset = generate(work, args.images, args.boxes, args.dim, args.parts)
        size_mb = sum(f.stat().st_size for f in files) / 2**20
        print(f"source: {args.images} images x {args.boxes} boxes x {args.dim}-d in "
              f"{args.parts} parts, {size_mb:.0f} MB")
        floor(files, simd_decode)  # once to fill the page cache
        floor_s, floor_bytes = floor(files)
        floor_mbs = floor_bytes / 2**20 / floor_s
        print(f"floor (read + split + base64 + frombuffer, the standard library's base64): "
              f"{floor_s:.1f} s, {floor_mbs:.0f} MB/s")
        simd_s, _ = floor(files, simd_decode)
        simd_mbs = floor_bytes / 2**20 / simd_s
        print(f"floor with pybase64's decoder (the one capstack uses): {simd_s:.1f} s, "
              f"{simd_mbs:.0f} MB/s")

        first = capstack_import(files, dataset, work / "stores")
        import_mbs = first["bytes"] / 2**20 / first["import_s"]
        hash_s = first["total_s"] - first["import_s"]
        print(f"capstack import (streaming pass): {first['import_s']:.1f} s, {import_mbs:.0f} MB/s,"
              f" {first['imported']} records")
        print(f"hashing the sources (first import only): {hash_s:.1f} s, "
              f"{size_mb / hash_s:.0f} MB/s")
        print(f"first import end to end: {first['total_s']:.1f} s, "
              f"{size_mb / first['total_s']:.0f} MB/s")
        print(f"ratio_import_to_floor: {import_mbs / floor_mbs:.2f} (target >= 0.80)")
        print(f"ratio_first_import_to_floor: {size_mb / first['total_s'] / floor_mbs:.2f}")
        print(f"ratio_import_to_pybase64_floor: {import_mbs / simd_mbs:.2f}")
        quarter = capstack_import(files_small, dataset_small, small / "stores")
        print(f"peak memory: {first['peak_mb']:.0f} MB importing {args.images} images, "
              f"{quarter['peak_mb']:.0f} MB importing {args.images // 4}; anonymous memory at "
              f"the end {first['heap_mb']:.0f} MB and {quarter['heap_mb']:.0f} MB (the rest is "
              f"file pages: the LMDB map and the source's read buffer)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
