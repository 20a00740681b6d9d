"""Stage engine: how long an up-to-date `capstack run prepare` takes on a big project.

Builds a project with a Karpathy json of 100k captions (20k images x 5) and an
image folder of 20k files, both deps of the prepare stage, then times:
  * the first run (hashing everything from scratch + prepare itself),
  * `capstack run prepare` when up to date (a whole process: start, checks, exit),
  * `capstack stages`,
  * hashing the image folder from scratch (no hash cache; files in the page cache),
and prints the figures and ratios.

    python benchmarks/stage_engine.py [--images 20000] [--file-kb 16] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import ROOT, capstack

from pipeline.core.hashing import HashCache

STAGES = """
stages:
  prepare:
    cmd: capstack prepare dataset_big.json prepared --min-count 5 --max-len 16
    deps: [dataset_big.json, images]
    outs: [prepared]
"""


def write_dataset(path: Path, n_images: int, rng: np.random.Generator) -> int:
    words = [f"w{i}" for i in range(12000)]
    zipf = np.minimum(rng.zipf(1.3, size=(n_images * 5, 16)), len(words)) - 1
    lengths = rng.integers(6, 20, size=n_images * 5)
    images, sentid = [], 0
    for i in range(n_images):
        sentences = []
        for _k in range(5):
            tokens = [words[j] for j in zipf[sentid, : min(lengths[sentid], 16)]]
            tokens += ["end"] * max(0, lengths[sentid] - 16)
            sentences.append({"tokens": tokens, "raw": " ".join(tokens), "imgid": i,
                              "sentid": sentid})
            sentid += 1
        split = "test" if i % 20 == 0 else "val" if i % 20 == 1 else "train"
        images.append({"filepath": "images", "filename": f"{i:06d}.jpg", "imgid": i,
                       "split": split, "sentids": [s["sentid"] for s in sentences],
                       "sentences": sentences})
    path.write_text(json.dumps({"dataset": "bench", "images": images}))
    return sentid


def write_image_files(folder: Path, n: int, kb: int, rng: np.random.Generator) -> int:
    """``n`` files of ``kb`` KB of random bytes, each distinct: what the stage engine hashes."""
    folder.mkdir()
    blob = rng.integers(0, 256, size=kb * 1024 * 4, dtype=np.uint8).tobytes()
    total = 0
    for i in range(n):
        start = (i * 997) % (len(blob) - kb * 1024)
        data = blob[start:start + kb * 1024] + i.to_bytes(4, "little")
        (folder / f"{i:06d}.jpg").write_bytes(data)
        total += len(data)
    return total


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--file-kb", type=int, default=16)
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        (work / "stages.yaml").write_text(STAGES)
        n_captions = write_dataset(work / "dataset_big.json", args.images, rng)
        nbytes = write_image_files(work / "images", args.images, args.file_kb, rng)
        print(f"project: {n_captions} captions, {args.images} image files "
              f"({nbytes / 2**20:.0f} MiB), "
              f"json {os.path.getsize(work / 'dataset_big.json') / 2**20:.0f} MiB")

        first, _ = capstack("run", "prepare", cwd=work, stages=work / "stages.yaml")
        print(f"first run (hash from scratch + prepare): {first:8.2f} s")

        skips = [capstack("run", "prepare", cwd=work, stages=work / "stages.yaml")[0]
                 for _ in range(args.repeats)]
        skip = statistics.median(skips)
        print(f"capstack run prepare, up to date:        {skip:8.3f} s (median of {args.repeats})")
        status = statistics.median(capstack("stages", cwd=work, stages=work / "stages.yaml")[0]
                                   for _ in range(args.repeats))
        print(f"capstack stages:                         {status:8.3f} s")

        started = time.perf_counter()
        HashCache(None).digest(work / "images")
        HashCache(None).digest(work / "dataset_big.json")
        scratch = time.perf_counter() - started
        print(f"hashing the deps from scratch (in-process, page cache warm): {scratch:8.3f} s")
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import cli"], check=True, cwd=ROOT)
        startup = time.perf_counter() - started
        print(f"python start + import cli alone:         {startup:8.3f} s")
        print(f"ratio up-to-date run / hashing from scratch: {skip / scratch:.2f}")
        print(f"up-to-date check beyond interpreter start: {skip - startup:.3f} s")


if __name__ == "__main__":
    main()
