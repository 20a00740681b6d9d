"""How fast the comparison page opens on 5,000 images, in headless Chromium (the target: under
two seconds).

    python benchmarks/page_load.py [--images 5000] [--loads 5] [--keep DIR]

It writes, in a temporary folder (or ``--keep DIR``), what two evaluations of N test images
hold when capstack knows their images: a small JPEG per image, the prepared image list and
references (5 captions an image, COCO-like lengths), a feature store that records the image
root, and for each of two systems its captions (a random grammar; B's differ from A's on about
70 % of the images), scored by capstack (BLEU, ROUGE-L, CIDEr-D; METEOR and SPICE skipped)
into metrics.json and image_statistics.json as ``capstack evaluate`` writes them. Then
``capstack report --compare A B`` writes the page (timed), and Chromium loads it ``--loads``
times, fresh each time:

- ``first render``: ``performance.now()`` when page.js has parsed the embedded rows, ranked
  them and put the first 50 in the document (``data-render-ms``), from the navigation's start;
- the same with a search (``#q=...``) and with the filter and the flip (``#filter=b&flip=1``);
- ``chromium wall``: the browser's whole run, its start and exit included (what a test waits).

Prints the page's size and the median, min and max of each over the loads.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import common  # this checkout importable  # noqa: F401

COLOURS = ["red", "green", "blue", "yellow", "purple", "orange", "black", "white"]
SHAPES = ["circle", "square", "triangle", "star", "ellipse", "hexagon", "cross", "diamond"]
PLACES = ["on the left", "on the right", "at the top", "at the bottom", "in the middle",
          "near the corner", "above a line", "beside a box"]
SIZES = ["small", "large", "tiny", "big", "medium"]
RGB = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220),
       "yellow": (230, 210, 40), "purple": (140, 60, 180), "orange": (240, 140, 30),
       "black": (20, 20, 20), "white": (245, 245, 245)}


def sentence(rng: np.random.Generator) -> tuple[str, str, str]:
    """(a caption, its colour, its shape)."""
    colour, shape = rng.choice(COLOURS), rng.choice(SHAPES)
    words = ["a", rng.choice(SIZES), colour, shape, rng.choice(PLACES)]
    if rng.random() < 0.5:
        words += ["and", "a", rng.choice(COLOURS), rng.choice(SHAPES)]
    return " ".join(words), colour, shape


def draw_images(root: Path, ids: list[int], rng: np.random.Generator) -> dict[int, list[str]]:
    """A 96-pixel JPEG per image (a coloured box on grey) and 5 references each."""
    from PIL import Image, ImageDraw

    references = {}
    for image_id in ids:
        refs = [sentence(rng) for _ in range(5)]
        image = Image.new("RGB", (96, 96), (128, 128, 128))
        x, y = (int(v) for v in rng.integers(5, 50, 2))
        ImageDraw.Draw(image).rectangle((x, y, x + 40, y + 40), fill=RGB[refs[0][1]])
        image.save(root / f"{image_id}.jpg", quality=85)
        references[image_id] = [r[0] for r in refs]
    return references


def write_store(path: Path, ids: list[int], image_root: Path) -> Path:
    """A feature store of one 4-d row per image that records ``image_root`` (where the page
    finds the images)."""
    from pipeline.features.stores import Record, Schema, create_writer, field

    meta = {**Schema((field("features", (4,), "float16"),)).to_meta(), "fingerprint": "page",
            "producer": {"name": "benchmark", "settings": {}, "about": {}},
            "capstack_version": "benchmark", "image_root": str(image_root)}
    with create_writer(path, meta) as writer:
        writer.write([(i, Record(np.zeros((1, 4), np.float32), 96, 96)) for i in ids])
        writer.finish()
    return path


def write_evaluation(folder: Path, name: str, captions: dict[int, str],
                     references: dict[int, list[str]], data: dict) -> Path:
    """metrics.json, image_statistics.json and results_test.json, as evaluate writes them."""
    from pipeline.core.jsonfile import write_json
    from trainer.scoring.metrics import STATISTICS_FILE, scored_images

    scores, per_image = scored_images(captions, references, spice=False, skip=("meteor",))
    folder.mkdir(parents=True)
    write_json(folder / "metrics.json", {"approach": name, "training": "XE",
                                         "family": "cross-entropy", **scores, "split": "test",
                                         "recipe": {"data": data}, "setting": {"seed": 0}})
    write_json(folder / STATISTICS_FILE, per_image, indent=None)
    write_json(folder / "results_test.json",
               [{"image_id": k, "caption": c} for k, c in captions.items()], indent=None)
    return folder


def make_evaluations(root: Path, images: int, seed: int = 0) -> tuple[Path, Path]:
    """Two evaluations of the same ``images`` images in ``root`` (see the module's doc)."""
    from pipeline.core.jsonfile import write_json

    rng = np.random.default_rng(seed)
    ids = list(range(1, images + 1))
    (root / "images").mkdir(parents=True)
    references = draw_images(root / "images", ids, rng)
    prepared = root / "prepared"
    prepared.mkdir()
    write_json(prepared / "images_test.json", [
        {"image_id": i, "row": k, "filepath": "", "filename": f"{i}.jpg"}
        for k, i in enumerate(ids)], indent=None)
    write_json(prepared / "refs_test.json", {
        "images": [{"id": i} for i in ids],
        "annotations": [{"image_id": i, "id": 10 * i + k, "caption": c}
                        for i in ids for k, c in enumerate(references[i])]}, indent=None)
    store = write_store(root / "grid.lmdb", ids, root / "images")
    data = {"captions": str(prepared), "features": [str(store)]}
    a = {i: references[i][0] if rng.random() < 0.5 else sentence(rng)[0] for i in ids}
    b = {i: a[i] if rng.random() < 0.3 else sentence(rng)[0] for i in ids}
    return (write_evaluation(root / "evals" / "a", "system_a", a, references, data),
            write_evaluation(root / "evals" / "b", "system_b", b, references, data))


def spread(values: list[float], digits: int = 1) -> str:
    """The median, min and max of ``values``."""
    return " ".join(f"{v:8.{digits}f}" for v in (statistics.median(values), min(values),
                                                  max(values)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--loads", type=int, default=5)
    ap.add_argument("--keep", type=Path, default=None, help="write here, and keep it")
    args = ap.parse_args(argv)
    from trainer.evaluation.compare import write_comparison
    from trainer.evaluation.page.browser import chromium, load

    if chromium() is None:
        print("no Chromium: install Debian's chromium package")
        return 1
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or Path(scratch)
        start = time.perf_counter()
        a, b = make_evaluations(root, args.images)
        made = time.perf_counter() - start
        start = time.perf_counter()
        written = write_comparison([a], [b], root / "page", resamples=1000)
        page_s = time.perf_counter() - start
        assert written.page is not None
        url = written.page.as_uri()
        rows = int(load(url, root / "profile").attribute("data-matching") or 0)
        size = written.page.stat().st_size / 1e6
        thumbnails = len(list((root / "page" / "thumbnails").glob("*.jpg")))
        print(f"{args.images} images, {rows} rows where the captions differ; index.html "
              f"{size:.1f} MB, {thumbnails} thumbnails beside it")
        print(f"evaluations made in {made:.1f} s; report --compare (bootstrap, page, "
              f"thumbnails) {page_s:.1f} s")
        print(f"{'load':<32} {'median':>8} {'min':>8} {'max':>8}  ({args.loads} loads)")
        for name, fragment in (("first render, ms", ""), ("with a search, ms", "#q=star"),
                               ("filter B ahead, flipped, ms", "#filter=b&flip=1")):
            loads = [load(url + fragment, root / "profile") for _ in range(args.loads)]
            if any(page.console for page in loads):
                print(f"console: {loads[0].console}")
                return 1
            rendered = [float(p.attribute("data-render-ms") or "nan") for p in loads]
            print(f"{name:<32} {spread(rendered)}")
            if not fragment:
                print(f"{'chromium wall (start to exit), s':<32} "
                      f"{spread([p.seconds for p in loads], 2)}")
        if args.keep:
            print(f"-> {written.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
