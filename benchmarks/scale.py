"""Scale: capstack's non-GPU costs on a synthetic COCO-like workload, at several sizes.

Everything capstack ran before this was a 3,000-image demo; COCO (Karpathy's splits) is
123,287 images, 616,767 captions, a vocabulary of ~9,500 words, 10-100 regions of 2,048-d
per image (a float16 store of ~17 GB) and 5,000 test images scored with METEOR in Java. This
script writes a workload shaped like it at each ``--images N`` into a temporary folder and
times each cost through capstack's own code, each in a fresh process, so that its peak
resident memory is its own: the process's VmHWM, or a child's ru_maxrss where it ran one
(the ``capstack`` command, METEOR's Java), whichever is larger. It prints one table, cost by
size (time / peak RSS), with the growth exponent between consecutive sizes
(``log(t2/t1) / log(N2/N1)``: 1 is linear, 2 quadratic; meaningless where a time is mostly
a fixed start, as for the ``capstack`` commands at 1k), notes per cost, and the same table
in markdown for the docs. ``--json FILE`` also writes every figure.

    python benchmarks/scale.py --images 1000 --images 10000            # ~4 min, 2 cores
    python benchmarks/scale.py --images 1000 --images 10000 --images 123287 --json scale.json
        # the full run
    python benchmarks/scale.py --images 10000 --costs prepare,batches --keep /tmp/scale
        # --keep DIR keeps (and next time reuses) the written workloads in DIR

Peak RSS counts the pages of files a process maps, and a store is read through LMDB's map:
a process that read the whole store (``verify_deep``) shows the store's 17 GB, page cache
the kernel takes back at will, not heap; the notes split a process's RSS at its end into
anonymous memory and mapped files (the kernel maps a record's neighbours in the page cache
too: ~600 KB mapped per 140 KB record read here).

The workload at N images (``--seed``):

* ``dataset_coco.json``, Karpathy's format (as ``capstack shapes`` writes it): COCO's split
  sizes scaled (113,287 train = 82,783 train + 30,504 restval, 5,000 val, 5,000 test at
  123,287), 5 captions an image (0.28 % of images 6 or 7, as COCO), caption lengths 7 + a
  geometric number of words (mean 10.6, 1 % over 20, at most 50), words drawn by Zipf's law
  (exponent 1.4) from 25,000 (at 123k ~23,500 occur, ~10,200 more than 5 times: the
  vocabulary ``--vocab-rule rtl`` keeps, COCO's 9,487);
* images: a small JPEG (~1-2 KB; ``--image-kb K`` pads each to K KB) per image under
  ``images/train2014`` and ``images/val2014``; hashing costs per file and per byte, so
  ``hash_bytes`` measures md5's MB/s once and projects COCO's 19.3 GB from it;
* region features: 10-100 regions an image (mean ~34: a 123k LMDB of ~17 GB), 2,048 float32
  from the model, float16 in the store, with boxes, scores and classes, written by the costs
  ``store_import`` and ``store_extract_h5`` (each removed after it) and ``store_extract``
  (kept: the store the later costs read).

The costs (``--costs`` picks some, by name, in this order):

=================  ===========================================================================
prepare            ``prepare_captions`` (``capstack prepare --vocab-rule rtl``): json ->
                   vocabulary, captions.h5, references
cider_df           ``build_cache``: the CIDEr-D document-frequency cache of the train split
stage_first        ``capstack run`` of a stage whose deps are the json and every image, with
                   no lock and no hash cache: every file hashed
stage_uptodate     ``capstack stages`` on that workdir when nothing changed (target < 2 s at
                   123k): every file stat-ed, none read
stage_touch        the same after one image's mtime changed (one file hashed again, still up
                   to date)
stage_edit         the same after one image's content changed (the stage is stale)
hash_bytes         md5 of a 256 MB file in the page cache: MB/s, and COCO's 19.3 GB from
                   scratch at that speed (printed as a note, once)
store_import       ``import_features`` of a self-critical.pytorch ``rtl-npz`` folder
                   (``<id>.npy`` float32, ``--import-dtype float16`` halves it, + ``_box``),
                   the hashing of the sources included (the notes split it off)
store_extract_h5   extraction's whole path (``run_job``: image hashes, fingerprint, the
                   DataLoader loop, ``writer.write`` per batch of 16, ``finish``) with a model
                   that returns the synthetic regions instead of running a detector; HDF5
store_extract      the same into an LMDB store, kept for the costs below
batches            ``TrainBatches`` of 50 images x 5 captions, random order, one core
                   (``torch.set_num_threads(1)``), from the page cache (the first 200 batches
                   of the epoch read once before they are timed): per batch and projected per
                   epoch, images/s (target >= 2,000)
train_memory       what ``capstack train`` builds before its first step (the ``Parts`` of
                   configs/coco/bottom_up/top_down.yaml on CPU, then its first batch): the
                   peak RSS is the figure (target <= 2 GB at 123k)
scoring            ``score()`` of trainer/scoring/metrics/ on the test split (5,000 images,
                   25k references at 123k) with synthetic predictions: PTB tokenizer, BLEU,
                   METEOR (Java), ROUGE-L, CIDEr; SPICE off
stores             ``capstack stores`` on the folder holding the store
verify             ``capstack verify STORE --dataset JSON``
verify_deep        ``capstack verify --deep``: every record read and checked
=================  ===========================================================================

How long: 1k and 10k together take ~4 min on 2 cores, disk ~5 GB at the peak. 123,287 took
21 min on 2 cores with other jobs beside it (load 3-4; a quiet machine is faster): the
workload 30 s, prepare and the CIDEr-D cache ~1.5 min, the import 7 min (writing its 32 GB
source 2 min, hashing it 2 min, importing 3 min), the HDF5 and LMDB writes 3.5 and 2.5 min,
``verify_deep`` 1 min, scoring 0.5 min. Free disk needed: ~52 GB at the import (its
source and its store), 17 GB after it; everything is removed at the end (also on Ctrl-C,
SIGTERM and errors) unless ``--keep``. Other processes slow every figure: the table's
heading and each cost's line give the load average beside them.

This file holds the costs and how each runs in a process of its own; ``scale_parts/``
writes the workload (workload.py) and prints the table (table.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import timed
from scale_parts.table import describe, load, print_tables
from scale_parts.workload import (BATCH_IMAGES, COCO_IMAGE_BYTES, EXPERIMENT, HASH_FILE_MB,
                                  SEQ_PER_IMG, TIMED_BATCHES, SyntheticRegions, Workload,
                                  capstack_in, ensure, extract_store, prepare, remove_store,
                                  sentences, word_list, write_workload)

# ============================================================================ the costs

COSTS: dict[str, dict] = {}


def cost(name: str, needs: tuple[str, ...] = (), once: bool = False):
    """Register a cost: ``fn(workload) -> {"seconds": .., "note": ..}``."""

    def register(fn):
        COSTS[name] = {"fn": fn, "needs": needs, "once": once}
        return fn

    return register


@cost("prepare")
def cost_prepare(w: Workload) -> dict:
    seconds, summary = timed(prepare, w)
    return {"seconds": seconds, "note": f"{sum(summary['captions'].values())} captions, "
                                        f"vocabulary {summary['vocab_size']}"}


@cost("cider_df", needs=("prepared",))
def cost_cider(w: Workload) -> dict:
    from trainer.rewards.cider_cache import build_cache

    seconds, scorer = timed(build_cache, w.prepared, "train", w.cider)
    return {"seconds": seconds, "note": f"{len(scorer.ngrams)} n-grams, "
                                        f"{os.path.getsize(w.cider) / 2**20:.0f} MB file"}


def stage_state(stdout: str) -> str:
    listing = json.loads(stdout)
    return listing["images_check"]["state"] + "".join(
        f" ({r})" for r in listing["images_check"]["reasons"])


@cost("stage_first")
def cost_stage_first(w: Workload) -> dict:
    for path in (w.path / "stages.lock", w.stamp):
        path.unlink(missing_ok=True)
    shutil.rmtree(w.path / ".capstack", ignore_errors=True)
    seconds, _ = capstack_in(w, "run", "images_check")
    return {"seconds": seconds, "note": f"{w.n} images hashed from scratch (capstack run)"}


def stage_check(w: Workload, note: str) -> dict:
    seconds, out = capstack_in(w, "stages", "--json")
    return {"seconds": seconds, "note": f"{note}: {stage_state(out)}"}


def after_changing_one_image(w: Workload, change, note: str) -> dict:
    """``capstack stages`` after ``change(image)`` (which returns how to undo it)."""
    stage_check(w, "warm-up")  # a previous cost may have left one file to rehash
    undo = change(next((w.images / "val2014").iterdir()))
    try:
        return stage_check(w, note)
    finally:
        undo()


def untouched(path: Path):
    return lambda: None


def touched(path: Path):
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    return lambda: None


def edited(path: Path):
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    return lambda: path.write_bytes(data)


@cost("stage_uptodate", needs=("lock",))
def cost_stage_uptodate(w: Workload) -> dict:
    return after_changing_one_image(w, untouched, "nothing changed")


@cost("stage_touch", needs=("lock",))
def cost_stage_touch(w: Workload) -> dict:
    return after_changing_one_image(w, touched, "one image's mtime changed")


@cost("stage_edit", needs=("lock",))
def cost_stage_edit(w: Workload) -> dict:
    return after_changing_one_image(w, edited, "one image's content changed")


@cost("hash_bytes", once=True)
def cost_hash_bytes(w: Workload) -> dict:
    from pipeline.core.hashing import md5_of_file

    path = w.path / "hash-bytes.bin"
    block = np.random.default_rng(5).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        for k in range(HASH_FILE_MB):
            f.write(block[k:] + block[:k])
    try:
        md5_of_file(path)  # into the page cache
        seconds, _ = timed(md5_of_file, path)
    finally:
        path.unlink()
    rate = HASH_FILE_MB / seconds
    return {"seconds": seconds, "note": f"md5 {rate:.0f} MB/s in the page cache: COCO's "
                                        f"{COCO_IMAGE_BYTES / 1e9:.1f} GB of images from "
                                        f"scratch ~{COCO_IMAGE_BYTES / 2**20 / rate:.0f} s"}


def cost_store(w: Workload, out: Path, keep: bool) -> dict:
    import pipeline.features.extract.job  # noqa: F401  (imports are not the cost)

    remove_store(out)
    try:
        seconds, result = timed(extract_store, w, out)
        size = sum(p.stat().st_size for p in out.rglob("*")) if out.is_dir() else \
            out.stat().st_size
    finally:
        if not keep:
            remove_store(out)
    return {"seconds": seconds,
            "note": f"{result.extracted} records, {size / 2**30:.2f} GiB, "
                    f"{size / 2**20 / seconds:.0f} MB/s"}


def write_import_source(w: Workload, folder: Path) -> int:
    """self-critical.pytorch's ``<folder>_att/<id>.npy`` (``--import-dtype``, float32 as
    make_bu_data.py writes them) and ``_box/<id>.npy``."""
    from tqdm import tqdm

    att, box = folder.with_name(folder.name + "_att"), folder.with_name(folder.name + "_box")
    att.mkdir(parents=True)
    box.mkdir()
    model, nbytes = SyntheticRegions(w), 0
    for image_id in tqdm(w.image_ids().tolist(), desc="import source", unit="file",
                         mininterval=2):
        record = model.record(image_id)
        np.save(att / f"{image_id}.npy", record.features.astype(w.import_dtype))
        np.save(box / f"{image_id}.npy", record["boxes"])
        nbytes += record.features.size * np.dtype(w.import_dtype).itemsize
    return nbytes


@cost("store_import")
def cost_store_import(w: Workload) -> dict:
    from pipeline.features.interchange.importer import ImportJob, import_features

    source = w.path / "import" / "regions"
    shutil.rmtree(source.parent, ignore_errors=True)
    nbytes = write_import_source(w, source)
    job = ImportJob("rtl-npz", [source.with_name("regions_att")], w.json, root=w.features,
                    out=w.features / "regions-import.lmdb")
    try:
        seconds, result = timed(import_features, job, progress=True)
    finally:
        shutil.rmtree(source.parent, ignore_errors=True)
        remove_store(w.features / "regions-import.lmdb")
    return {"seconds": seconds,
            "note": f"{result.report.imported} records, source {nbytes / 2**30:.2f} GiB; "
                    f"streaming {result.seconds:.1f} s ({result.mb_per_s:.0f} MB/s), the rest "
                    f"hashing the sources"}


@cost("store_extract_h5")
def cost_store_extract_h5(w: Workload) -> dict:
    return cost_store(w, w.features / "regions-extract.h5", keep=False)


@cost("store_extract")
def cost_store_extract(w: Workload) -> dict:
    return cost_store(w, w.store, keep=True)


def train_batches(w: Workload):
    from pipeline.captions.prepared import load_captions
    from trainer.data import Features, TrainBatches, covered

    features = Features([w.store])
    captions = covered(load_captions(w.prepared), features)
    return TrainBatches(captions, features, batch_size=BATCH_IMAGES, seq_per_img=SEQ_PER_IMG,
                        seed=0)


@cost("batches", needs=("prepared", "store"))
def cost_batches(w: Workload) -> dict:
    import torch

    torch.set_num_threads(1)
    batches = train_batches(w)
    order = batches.order(0)
    timed_rows = order[:TIMED_BATCHES]
    for rows in timed_rows:  # into the page cache
        batches.features.read(batches.captions.image_ids[rows].tolist())
    rng = np.random.default_rng(0)
    started, images, rounds = time.perf_counter(), 0, 0
    while rounds < 3 or time.perf_counter() - started < 2.0:
        for index, rows in enumerate(timed_rows):
            images += len(batches.batch(rows, rng, index).image_ids)
        rounds += 1
    seconds = time.perf_counter() - started
    per_batch = seconds / (rounds * len(timed_rows))
    rate = images / seconds
    return {"seconds": per_batch * len(order),
            "note": f"{per_batch * 1e3:.1f} ms a batch of {BATCH_IMAGES}, {rate:.0f} images/s "
                    f"(target >= 2000); epoch of {len(order)} batches projected "
                    f"{per_batch * len(order):.1f} s"}


@cost("train_memory", needs=("prepared", "store"))
def cost_train_memory(w: Workload) -> dict:
    from trainer.config import load_experiment
    from trainer.train import resident_mb
    from trainer.training.build import build, close
    from trainer.training.resume import resume

    out = w.path / "run"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    started = time.perf_counter()
    config = load_experiment(EXPERIMENT, [f"data.captions={w.prepared}",
                                          f"data.features=[{w.store}]", "train.device=cpu"])
    parts = build(config, out)
    resume(parts)
    batch = next(iter(parts.batches.epoch(0)))
    seconds = time.perf_counter() - started
    now = resident_mb()
    close(parts)
    shutil.rmtree(out, ignore_errors=True)
    return {"seconds": seconds, "note": f"{config.name}: RSS {now:.0f} MB at the first batch "
                                        f"({len(batch.image_ids)} images)"}


def predictions(w: Workload, image_ids) -> dict[int, str]:
    rng = np.random.default_rng([w.seed, 6])
    tokens = sentences(rng, len(image_ids), np.array(word_list()))
    return {int(i): " ".join(t) for i, t in zip(image_ids, tokens)}


@cost("scoring", needs=("prepared",))
def cost_scoring(w: Workload) -> dict:
    from trainer.scoring import metrics

    references = metrics.load_references(w.prepared / "refs_test.json")
    candidates = predictions(w, sorted(references))
    parts: dict[str, float] = {}
    for name in ("_tokenize_any", "_bleu", "_meteor", "_rouge", "_cider"):
        setattr(metrics, name, part_timer(getattr(metrics, name), name.strip("_"), parts))
    seconds, scored = timed(metrics.score, candidates, references, spice=False)
    missing = {k: v for k, v in scored["unavailable"].items() if k != "SPICE"}
    return {"seconds": seconds,
            "note": f"{len(candidates)} images, {sum(map(len, references.values()))} "
                    f"references; " + ", ".join(f"{k} {v:.1f} s" for k, v in parts.items())
                    + (f"; unavailable: {missing}" if missing else "")}


def part_timer(fn, name: str, parts: dict):
    def wrapped(*args, **kwargs):
        seconds, value = timed(fn, *args, **kwargs)
        parts[name] = parts.get(name, 0.0) + seconds
        return value

    return wrapped


@cost("stores", needs=("store",))
def cost_stores(w: Workload) -> dict:
    seconds, out = capstack_in(w, "stores", "--features-root", str(w.features))
    return {"seconds": seconds, "note": out.splitlines()[1].strip()}


@cost("verify", needs=("store",))
def cost_verify(w: Workload) -> dict:
    seconds, out = capstack_in(w, "verify", str(w.store), "--dataset", str(w.json))
    return {"seconds": seconds, "note": out.strip().split(": ", 1)[1]}


@cost("verify_deep", needs=("store",))
def cost_verify_deep(w: Workload) -> dict:
    seconds, out = capstack_in(w, "verify", str(w.store), "--dataset", str(w.json), "--deep")
    return {"seconds": seconds, "note": out.strip().splitlines()[-1].split(": ", 1)[1]}


# ============================================================================ processes

def memory_mb() -> dict[str, float]:
    """Peak resident memory: this process's (VmHWM) or a child's it ran (capstack, Java),
    whichever is larger; and, now, the anonymous part of this one's and the part that maps
    files (libraries; a store's pages read through LMDB's map: page cache, not heap).

    Not the parent's ``wait4`` ru_maxrss: Linux keeps in it the RSS the child had before its
    exec, the parent's own (the parent holds the workload's json: 1 GB at 123k)."""
    import resource

    wanted = {"VmHWM:": "own_peak_mb", "RssAnon:": "anon_mb", "RssFile:": "file_mb"}
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key = line.split(maxsplit=1)[0] if line else ""
        if key in wanted:
            out[wanted[key]] = int(line.split()[1]) / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {**out, "children_peak_mb": children, "peak_mb": max(out["own_peak_mb"], children)}


def worker(args: argparse.Namespace) -> None:
    """In a fresh process: ``ensure:NEED`` makes a need, else the cost runs and its figures
    go to ``args.result`` (JSON)."""
    w = Workload.at(args.workload, args.import_dtype)
    os.environ["CAPSTACK_FEATURES"] = str(w.features)  # nothing lands in ~/.cache
    if args.worker.startswith("ensure:"):
        ensure(args.worker.split(":", 1)[1], w)
        figures = {}
    else:
        figures = COSTS[args.worker]["fn"](w)
    args.result.write_text(json.dumps({**figures, **memory_mb()}))


def in_child(task: str, w: Workload, timeout: float) -> dict:
    """Run ``task`` in a fresh process: its figures (memory_mb's among them), or {"error": ..}."""
    result = w.path / "results" / f"{task.replace(':', '-')}.json"
    result.parent.mkdir(exist_ok=True)
    result.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, __file__, "--worker", task, "--workload",
                             str(w.path), "--result", str(result), "--import-dtype",
                             w.import_dtype],
                            env={**os.environ, "CAPSTACK_FEATURES": str(w.features)})
    try:
        proc.wait(timeout)
    except BaseException:  # a timeout, Ctrl-C
        proc.kill()
        proc.wait()
        if not isinstance(sys.exc_info()[1], subprocess.TimeoutExpired):
            raise
        return {"error": f"{task}: timed out after {timeout:.0f} s"}
    if proc.returncode != 0 or not result.is_file():
        return {"error": f"{task}: exit {proc.returncode}"}
    return json.loads(result.read_text())


def measure(w: Workload, names: list[str], timeout: float, results: dict) -> None:
    """Each cost at this size, its needs first; figures into results[cost][n]."""
    for name in names:
        for need in COSTS[name]["needs"]:
            if "error" in (made := in_child(f"ensure:{need}", w, timeout)):
                results.setdefault(name, {})[w.n] = made
                break
        else:
            started = time.perf_counter()
            print(f"-- {name} at {w.n} images", flush=True)
            results.setdefault(name, {})[w.n] = figures = in_child(name, w, timeout)
            print(f"   {describe(figures)} ({time.perf_counter() - started:.0f} s with the "
                  f"process; load {load()})", flush=True)



# ============================================================================ main

def parse_costs(text: str | None) -> list[str]:
    names = list(COSTS) if not text else [c.strip() for c in text.split(",") if c.strip()]
    unknown = [n for n in names if n not in COSTS]
    if unknown:
        raise SystemExit(f"unknown cost(s) {', '.join(unknown)}; choose from {', '.join(COSTS)}")
    return [n for n in COSTS if n in names]  # in the order they build on each other


def arguments(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, action="append",
                    help="dataset size (repeat for several; default 1000 and 10000)")
    ap.add_argument("--costs", help=f"comma-separated subset of: {', '.join(COSTS)}")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where the temporary folder goes (default: the system's temp dir)")
    ap.add_argument("--keep", type=Path, default=None, metavar="DIR",
                    help="write the workloads in DIR, keep them and reuse them next time")
    ap.add_argument("--image-kb", type=int, default=0,
                    help="pad each image file to this many KB (default: small JPEGs)")
    ap.add_argument("--import-dtype", choices=("float32", "float16"), default="float32",
                    help="dtype of store_import's source files (float16 halves their disk)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=3600, help="seconds a cost may take")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--workload", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def work_folder(args: argparse.Namespace):
    """--keep DIR as it is, else a temporary folder removed at the end, on errors, Ctrl-C and
    SIGTERM."""
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        yield args.keep
        return
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="capstack-scale-", dir=args.workdir))
    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        yield folder
    finally:
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(folder, ignore_errors=True)
        print(f"removed {folder}", flush=True)


def main(argv=None) -> None:
    args = arguments(argv)
    if args.worker:
        worker(args)
        return
    names, sizes = parse_costs(args.costs), sorted(set(args.images or [1000, 10_000]))
    results: dict[str, dict] = {}
    print(f"capstack scale: sizes {sizes}, costs {', '.join(names)}; load {load()}", flush=True)
    with work_folder(args) as folder:
        for n in sizes:
            w = Workload(folder / f"n{n}", n, args.seed, args.image_kb, args.import_dtype)
            write_workload(w)
            measure(w, [c for c in names if not (COSTS[c]["once"] and n != sizes[0])],
                    args.timeout, results)
    print_tables(results, sizes, {name for name in COSTS if COSTS[name]["once"]})
    if args.json:
        args.json.write_text(json.dumps({"sizes": sizes, "load": load(), "results": results},
                                        indent=1))


if __name__ == "__main__":
    main()
