"""benchmarks/scale.py's workload: a synthetic COCO-like dataset, its images and region
features at N images (scale.py's docstring describes it), and what its costs need made
first, untimed."""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from common import ROOT, capstack

COCO_IMAGES = 123_287
COCO_SPLITS = {"restval": 30_504, "val": 5_000, "test": 5_000}  # the rest is train
COCO_IMAGE_BYTES = 19.3e9  # train2014 + val2014
WORDS = 25_000
ZIPF = 1.4
LENGTH_P = 0.28  # caption length 7 + geometric(LENGTH_P): mean 10.6
MAX_WORDS = 50
EXTRA_CAPTIONS = (0.0025, 0.0003)  # P(a 6th caption), P(a 7th)
REGIONS = (10, 100)
REGION_SHAPE, REGION_SCALE = 1.2, 20.0  # regions 10 + gamma: mean ~34
DIM = 2048
POOL = 64  # distinct feature blocks reused (writing them is not what is measured)
BATCH_IMAGES, SEQ_PER_IMG, TIMED_BATCHES = 50, 5, 200
HASH_FILE_MB = 256
STAGES_YAML = """\
stages:
  images_check:
    desc: a stage whose deps are the dataset and every image (the scale benchmark's)
    cmd: echo checked > stamp.txt
    shell: true
    deps: [dataset_coco.json, images]
    outs: [stamp.txt]
"""
EXPERIMENT = ROOT / "configs" / "coco" / "bottom_up" / "top_down.yaml"


# ============================================================================ the workload

class Workload:
    """The files of one size, in ``path``; what exists is reused (``--keep``)."""

    def __init__(self, path: Path, n: int, seed: int, image_kb: int,
                 import_dtype: str = "float32"):
        self.path, self.n, self.seed, self.image_kb = path, n, seed, image_kb
        self.import_dtype = import_dtype  # of the import's source files (not the workload's)
        self.json = path / "dataset_coco.json"
        self.images = path / "images"
        self.prepared = path / "prepared"
        self.cider = path / "cider" / "train.npz"
        self.features = path / "features"
        self.store = self.features / "regions-extract.lmdb"
        self.stamp = path / "stamp.txt"

    @classmethod
    def at(cls, path: Path, import_dtype: str) -> "Workload":
        spec = json.loads((path / "workload.json").read_text())
        return cls(path, spec["n"], spec["seed"], spec["image_kb"], import_dtype)

    def spec(self) -> dict:
        return {"n": self.n, "seed": self.seed, "image_kb": self.image_kb, "version": 2}

    def written(self) -> bool:
        try:
            return json.loads((self.path / "workload.json").read_text()) == self.spec()
        except (OSError, ValueError):
            return False

    def region_counts(self) -> np.ndarray:
        """Regions of each image, by its position in the json."""
        rng = np.random.default_rng([self.seed, 1])
        extra = np.rint(rng.gamma(REGION_SHAPE, REGION_SCALE, self.n)).astype(np.int64)
        return np.clip(REGIONS[0] + extra, *REGIONS)

    def image_ids(self) -> np.ndarray:
        """COCO-like ids: distinct, unordered, up to ~6 digits."""
        rng = np.random.default_rng([self.seed, 2])
        return rng.choice(max(600_000, 2 * self.n), self.n, replace=False) + 1


def split_plan(n: int) -> list[str]:
    """COCO's Karpathy splits scaled to ``n`` images, in COCO's order: train, restval, val, test."""
    sizes = {s: round(k * n / COCO_IMAGES) for s, k in COCO_SPLITS.items()}
    sizes["val"], sizes["test"] = max(1, sizes["val"]), max(1, sizes["test"])
    return (["train"] * (n - sum(sizes.values())) + ["restval"] * sizes["restval"]
            + ["val"] * sizes["val"] + ["test"] * sizes["test"])


def word_list(count: int = WORDS) -> list[str]:
    """Pronounceable distinct words, the frequent ones short (rank 0 first)."""
    syllables = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"] + ["ya", "yo", "wu", "xe"]
    words, k = [], 0
    while len(words) < count:
        word, rest = "", k
        while True:
            word += syllables[rest % len(syllables)]
            rest //= len(syllables)
            if not rest:
                break
        words.append(word)
        k += 1
    return words


def sentences(rng: np.random.Generator, count: int, words: np.ndarray) -> list[list[str]]:
    """``count`` captions' tokens: COCO-like lengths, Zipf-distributed words."""
    lengths = np.minimum(7 + rng.geometric(LENGTH_P, count), MAX_WORDS)
    ranks = rng.zipf(ZIPF, int(lengths.sum())) - 1
    while (beyond := ranks >= len(words)).any():  # drawn again: Zipf's law on the words kept
        ranks[beyond] = rng.zipf(ZIPF, int(beyond.sum())) - 1
    tokens = words[ranks]
    ends = np.cumsum(lengths)
    return [tokens[end - m:end].tolist() for end, m in zip(ends, lengths)]


def write_dataset(w: Workload) -> None:
    """The Karpathy json: COCO's fields, folders and file names."""
    rng = np.random.default_rng([w.seed, 0])
    plan, ids = split_plan(w.n), w.image_ids()
    extra = rng.random(w.n)
    per_image = 5 + (extra < EXTRA_CAPTIONS[0]) + (extra < EXTRA_CAPTIONS[1])
    tokens = sentences(rng, int(per_image.sum()), np.array(word_list()))
    images, sentid = [], 0
    for imgid, (split, cocoid, k) in enumerate(zip(plan, ids.tolist(), per_image.tolist())):
        folder = "train2014" if split == "train" else "val2014"
        sents = [{"tokens": t, "raw": " ".join(t).capitalize() + ".", "imgid": imgid,
                  "sentid": sentid + j} for j, t in enumerate(tokens[sentid:sentid + k])]
        images.append({"filepath": folder, "filename": f"COCO_{folder}_{cocoid:012d}.jpg",
                       "imgid": imgid, "cocoid": cocoid, "split": split,
                       "sentids": [s["sentid"] for s in sents], "sentences": sents})
        sentid += k
    w.json.write_text(json.dumps({"dataset": "coco", "images": images}))


def jpeg_pool(rng: np.random.Generator, count: int = POOL) -> list[bytes]:
    from PIL import Image

    pool = []
    for _ in range(count):
        h, w = rng.integers(24, 64, 2)
        image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=75)
        pool.append(buffer.getvalue())
    return pool


def write_images(w: Workload) -> None:
    """One small JPEG a dataset image (bytes after its end make each file distinct)."""
    from tqdm import tqdm

    rng = np.random.default_rng([w.seed, 3])
    pool = jpeg_pool(rng)
    padding = rng.integers(0, 256, max(w.image_kb, 1) * 1024, dtype=np.uint8).tobytes()
    dataset = json.loads(w.json.read_text())
    for k, im in enumerate(tqdm(dataset["images"], desc=f"images ({w.n})", unit="img",
                                mininterval=2)):
        folder = w.images / im["filepath"]
        folder.mkdir(parents=True, exist_ok=True)
        data = pool[k % len(pool)] + im["cocoid"].to_bytes(8, "little")
        if w.image_kb:
            data += padding[:max(0, w.image_kb * 1024 - len(data))]
        (folder / im["filename"]).write_bytes(data)


def write_workload(w: Workload) -> None:
    """The json, the images and the stages file, unless this spec's are there already."""
    if w.written():
        return
    if w.path.exists():
        shutil.rmtree(w.path)
    w.path.mkdir(parents=True)
    started = time.perf_counter()
    write_dataset(w)
    write_images(w)
    (w.path / "stages.yaml").write_text(STAGES_YAML)
    (w.path / "workload.json").write_text(json.dumps(w.spec()))
    print(f"workload {w.n}: {os.path.getsize(w.json) / 2**20:.0f} MB json, images in "
          f"{time.perf_counter() - started:.0f} s", flush=True)


# ============================================================================ what costs need

def feature_pool(seed: int):
    """POOL blocks of 100 regions: features float32 (what an extractor returns; the store
    keeps float16), boxes, scores, classes."""
    rng = np.random.default_rng([seed, 4])
    features = np.abs(rng.standard_normal((POOL, REGIONS[1], DIM), np.float32))
    xy = rng.random((POOL, REGIONS[1], 2), np.float32) * 400
    boxes = np.concatenate([xy, xy + 60], 2)
    scores = rng.random((POOL, REGIONS[1]), np.float32)
    classes = rng.integers(1, 1600, (POOL, REGIONS[1])).astype(np.int32)
    return features, boxes, scores, classes


class SyntheticRegions:
    """A BatchModel (pipeline/features/extract/runner.py) that returns each image's regions
    from the pool instead of running a detector."""

    def __init__(self, w: Workload):
        self.counts = dict(zip(w.image_ids().tolist(), w.region_counts().tolist()))
        self.pool = feature_pool(w.seed)

    def record(self, image_id: int):
        from pipeline.features.stores import Record

        n, k = self.counts[image_id], image_id % POOL
        features, boxes, scores, classes = (a[k, :n] for a in self.pool)
        return Record(features, 480, 640, boxes=boxes, scores=scores, classes=classes)

    def __call__(self, batch: dict) -> list:
        return [self.record(int(i)) for i in batch["image_ids"]]


def no_transform(image):
    """The extraction's transform: the model here needs no pixels."""
    import torch

    return torch.zeros(0)


def extract_store(w: Workload, out: Path):
    """Extraction's path (``run_job``) into ``out``, the model aside."""
    from pipeline.features.extract.job import Extraction, ExtractionJob, run_job
    from pipeline.features.extract.kinds.region_base import region_schema

    extraction = Extraction(
        kind="regions", backbone="synthetic", settings={"extractor": "scale-benchmark"},
        describe={}, schema=region_schema(DIM, "float16"), dtype="float16",
        make_model=lambda: SyntheticRegions(w), transform=no_transform)
    return run_job(ExtractionJob(extraction, w.json, w.images, out=out, root=w.features,
                                 batch_size=16, workers=0, progress=True))


def remove_store(path: Path) -> None:
    from pipeline.features.stores import remove_store as remove

    remove(path)
    path.with_name(path.name + ".users.json").unlink(missing_ok=True)


def ensure(need: str, w: Workload) -> None:
    """Make what a cost reads, untimed (run in its own process before the cost's)."""
    if need == "prepared" and not (w.prepared / "checksums.json").is_file():
        prepare(w)
    elif need == "store" and not w.store.exists():
        remove_store(w.store)  # a partial one
        extract_store(w, w.store)
    elif need == "lock" and not (w.path / "stages.lock").is_file():
        capstack_in(w, "run", "images_check")


def prepare(w: Workload) -> dict:
    from pipeline.captions.prepare import prepare_captions

    return prepare_captions(w.json, w.prepared, min_count=5, max_len=16, vocab_rule="rtl",
                            force=True)


def capstack_in(w: Workload, *args: str) -> tuple[float, str]:
    """``capstack ARGS`` as a process of its own in the workload (stage commands get
    ``--workdir`` and ``-c``): its wall time and stdout."""
    stages = w.path / "stages.yaml" if args[0] in ("run", "stages") else None
    return capstack(*args, cwd=w.path, stages=stages)
