"""A rehearsal of the real-data stages file: a paper block run end to end, at real sizes, on
made-up data, each stage measured and projected to COCO beside real_data_needs.py's estimate.

Why: real_data_needs.py estimates what a block needs from rates measured on loops (the
extraction loop, a training step), never from configs/coco.yaml run as a user runs it. This
runs that file's stages as they are, through ``capstack run STAGE -c COPY --workdir WORK``
(one process a stage, in the order ``capstack run BLOCK --with-deps`` runs them), on inputs
shaped like COCO's, so that whatever breaks, or costs more than estimated, at real sizes shows
up on a small N before the real data does.

How, in the workdir:

- ``images/train2014``, ``images/val2014``: N photo-like JPEGs at COCO's sizes (about 640×480,
  640×427 and their portrait forms, the rest 640 by 300-640; a gradient, shapes and noise, at
  about COCO's 157 KB a file);
- ``dataset_coco.json`` in Karpathy's layout: COCO's split shares, 5 captions an image, COCO's
  caption lengths and a Zipf vocabulary calibrated on COCO's (benchmarks/scale.py's: 25,000
  words, of which COCO's ~9,500 pass ``prepare``'s rule at 123k images; at N images prepare
  keeps far fewer, and the table's heading says how many);
- ``weights/``: random weights in exactly the files the stages file names (the VG detector in
  MILVLG's ``bua-caffe`` naming, written by benchmarks/vg_checkpoints.py; torchvision
  ResNet-101 / VGG-19 state_dicts where a grid stage is added);
- ``coco.yaml``: configs/coco.yaml loaded and dumped again with its ``params:`` paths pointed at
  these, every ``epochs`` param at 1; ``configs/coco/...``: the experiments the stages read, their
  ``train.epochs`` at 1 (the models' sizes untouched); the feature stores in ``features/``
  (``$CAPSTACK_FEATURES``), so nothing lands in ~/.cache.

Per stage it prints the wall time; images/s (extraction: the command's own figure; training:
images trained on over the training's own seconds, summary.json's; otherwise images over the
wall time); peak host memory (the largest RSS among the stage's processes); peak
GPU memory (``torch.cuda.max_memory_allocated`` in the stage's command, written at its exit by
a ``sitecustomize`` put on its PYTHONPATH); the disk of its outs (a pointer's store included).
Then each projected to COCO (123,287 images; a training epoch of 113,287; 5,000 test images)
beside real_data_needs.py's figure for the same stage, with those that differ by more than 25 %
flagged. A projection from the wall time (``≤``) counts the stage's start-up as per-image
work, a bound at a small N; a CPU's hours are not a GPU's: the run that checks the estimates
is ``--images 1000 --device cuda`` (benchmarks/gpu_checklist.sh).

    python benchmarks/rehearsal.py [--images 8] [--block tables_bottom_up] [--also extract_grid]
        [--device cpu|cuda] [--workdir DIR] [--keep] [--json PATH]
"""

# (no `from __future__ import annotations`: the dataclass below must build when the file is
# loaded outside sys.modules, as tests/test_benchmarks.py loads every script)

import argparse
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from common import ROOT

import numpy as np
import yaml

from cli import main as capstack
from pipeline.core.pointer import target_of
from pipeline.engine.stagefile import Stage, StagesFile, load_stages_file

STAGES_FILE = ROOT / "configs" / "coco.yaml"
MARKER = "rehearsal.json"  # a workdir holding it is a rehearsal's, cleared before a new one
FLAG = 0.25  # a projection this far from the estimate is flagged


def sibling(name: str):
    """Another script of benchmarks/ as a module (registered as tests/test_benchmarks.py
    registers it, so that a script loaded twice is one module)."""
    key = f"benchmark_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


needs = sibling("real_data_needs")  # its estimates, COCO's split sizes
scale = importlib.import_module("scale_parts.workload")  # scale.py's COCO-calibrated captions
vg_checkpoints = sibling("vg_checkpoints")  # its random VG detector in MILVLG's naming
COCO = needs.DATASETS["dataset_coco.json"]


# -- the images ------------------------------------------------------------------------------
# (width, height, share): COCO's most common sizes; the rest a 640 side and a shorter one
SIZES = ((640, 480, 0.40), (640, 427, 0.25), (480, 640, 0.15), (427, 640, 0.05))
NOISE, TEXTURE, QUALITY = 10.0, 20.0, 92  # about COCO's 157 KB a 640×480 file


def image_size(rng: np.random.Generator) -> tuple[int, int]:
    draw = rng.random()
    for w, h, share in SIZES:
        if draw < share:
            return w, h
        draw -= share
    short = int(rng.integers(300, 641))
    return (640, short) if rng.random() < 0.7 else (short, 640)


def photo(rng: np.random.Generator, w: int, h: int) -> bytes:
    """A JPEG that compresses as a photo does: a smooth gradient, a few blurred shapes,
    mid-frequency texture and sensor-like noise."""
    from PIL import Image, ImageDraw, ImageFilter

    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    angle = rng.uniform(0, 2 * np.pi)
    t = x * np.cos(angle) + y * np.sin(angle)
    t = ((t - t.min()) / (np.ptp(t) + 1e-6))[..., None]
    c0, c1 = rng.uniform(0, 255, (2, 3)).astype(np.float32)
    image = Image.fromarray((c0 * (1 - t) + c1 * t).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(3, 9))):
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        sw, sh = rng.uniform(0.05, 0.5) * w / 2, rng.uniform(0.05, 0.5) * h / 2
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape([cx - sw, cy - sh, cx + sw, cy + sh], fill=tuple(rng.integers(0, 256, 3).tolist()))
    image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.8, 2.0)))
    coarse = rng.normal(0, TEXTURE, (h // 2 + 1, w // 2 + 1)).astype(np.float32)
    texture = np.asarray(Image.fromarray(coarse, mode="F").resize((w, h), Image.BICUBIC))
    pixels = (np.asarray(image, dtype=np.float32) + texture[..., None]
              + rng.normal(0, NOISE, (h, w, 3)))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, "JPEG",
                                                                   quality=QUALITY)
    return buffer.getvalue()


# -- the dataset -----------------------------------------------------------------------------
def write_dataset(work: Path, n: int, seed: int) -> dict:
    """N images and Karpathy's ``dataset_coco.json`` for them; what was written, in figures."""
    rng = np.random.default_rng(seed)
    plan = scale.split_plan(n)
    cocoids = (rng.choice(600_000, n, replace=False) + 1).tolist()
    tokens = scale.sentences(rng, 5 * n, np.array(scale.word_list()))
    images, sizes, jpeg_bytes = [], [], 0
    for imgid, (split, cocoid) in enumerate(zip(plan, cocoids)):
        folder = "train2014" if split == "train" else "val2014"
        name = f"COCO_{folder}_{cocoid:012d}.jpg"
        w, h = image_size(rng)
        data = photo(rng, w, h)
        (work / "images" / folder).mkdir(parents=True, exist_ok=True)
        (work / "images" / folder / name).write_bytes(data)
        sizes.append((w, h))
        jpeg_bytes += len(data)
        sents = [{"tokens": t, "raw": " ".join(t).capitalize() + ".", "imgid": imgid,
                  "sentid": 5 * imgid + j} for j, t in enumerate(tokens[5 * imgid:5 * imgid + 5])]
        images.append({"filepath": folder, "filename": name, "imgid": imgid, "cocoid": cocoid,
                       "split": split, "sentids": [s["sentid"] for s in sents],
                       "sentences": sents})
    (work / "dataset_coco.json").write_text(json.dumps({"dataset": "coco", "images": images}))
    lengths = [len(t) for t in tokens]
    splits = {s: plan.count(s) for s in ("train", "restval", "val", "test")}
    return {"images": n, "splits": splits, "train_images": splits["train"] + splits["restval"],
            "portrait": sum(w < h for w, h in sizes), "jpeg_kb": jpeg_bytes / n / 1e3,
            "captions": len(tokens), "words_mean": float(np.mean(lengths)),
            "words_range": [min(lengths), max(lengths)]}


# -- the weights -----------------------------------------------------------------------------
def vg_detector(path: Path) -> None:
    written = vg_checkpoints.write(vg_checkpoints.random_vg_detector(0), "bua-caffe",
                                   path.parent)
    if written != path:
        written.rename(path)


def torchvision_weights(arch: str):
    def write(path: Path) -> None:
        import torch
        import torchvision

        torch.manual_seed(0)
        # zero_init_residual: every residual branch starts at zero, which keeps a random
        # ResNet's activations small (PyTorch's default initialisation overflows float16 under
        # the extraction's autocast on a GPU: benchmarks/extraction.py, --autocast)
        kwargs = {"zero_init_residual": True} if arch.startswith("resnet") else {}
        torch.save(getattr(torchvision.models, arch)(weights=None, **kwargs).state_dict(), path)
    return write


# the stages file's weight params, and how a random file of the same layout is written
WEIGHTS = {"detector_weights": vg_detector,
           "backbone_weights": torchvision_weights("resnet101"),
           "backbone_weights_v2": torchvision_weights("resnet101"),
           "vgg_weights": torchvision_weights("vgg19")}


def write_weights(work: Path, stages: list[Stage]) -> None:
    """Each weights file the stages depend on, where the stages file copy names it."""
    for stage in stages:
        for param, value in stage.params.items():
            path = Path(value) if param in WEIGHTS else None
            if path is not None and not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                WEIGHTS[param](path)


# -- the stages file's copy ------------------------------------------------------------------
def copy_stages_file(work: Path) -> Path:
    """configs/coco.yaml with its paths in the workdir and every ``epochs`` param at 1."""
    raw = yaml.safe_load(STAGES_FILE.read_text(encoding="utf-8"))
    params = raw["params"]
    params["dataset_json"] = str(work / "dataset_coco.json")
    params["image_root"] = str(work / "images")
    for param in WEIGHTS:
        params[param] = str(work / "weights" / Path(params[param]).name)
    for body in raw["stages"].values():
        own = body.get("do", body).get("params") or {}
        if "epochs" in own:
            own["epochs"] = 1
    copy = work / STAGES_FILE.name
    copy.write_text(yaml.safe_dump(raw, sort_keys=False, width=1000), encoding="utf-8")
    return copy


def copy_experiment(work: Path, relative: str) -> None:
    """An experiment file (and what it extends) into the workdir, ``train.epochs`` at 1."""
    source, target = ROOT / relative, work / relative
    raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    if isinstance(raw.get("train"), dict):
        raw["train"]["epochs"] = 1
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    if raw.get("extends"):
        copy_experiment(work, os.path.normpath(Path(relative).parent / raw["extends"]))


def run_order(stages: StagesFile, block: str, also: list[str]) -> list[str]:
    """What ``capstack run NAME --with-deps`` runs for the block and each ``also``, in the
    file's order."""
    wanted = {block, *also}
    needed = set(wanted).union(*(stages.upstream_closure(name) for name in wanted))
    return [name for name in stages.order if name in needed]


# -- running a stage -------------------------------------------------------------------------
# written into the stage's processes' path: the GPU memory peak of a process that used CUDA
SITECUSTOMIZE = '''\
import atexit, os, sys
def _rehearsal_gpu_peak():
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            with open(os.environ["CAPSTACK_REHEARSAL_GPU_PEAK"], "a") as f:
                f.write(f"{torch.cuda.max_memory_allocated()}\\n")
    except Exception:
        pass
atexit.register(_rehearsal_gpu_peak)
'''


@dataclass
class Ran:
    """One stage's run, measured."""
    stage: str
    command: str
    wall_s: float
    rss_mb: float
    gpu_mb: float | None
    disk_bytes: int
    output: str


def environment(work: Path, device: str) -> dict[str, str]:
    site = work / ".rehearsal"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "CAPSTACK_FEATURES": str(work / "features"), "PYTHONPATH": path,
           "CAPSTACK_REHEARSAL_GPU_PEAK": str(site / "gpu_peak.txt"), "PYTHONUNBUFFERED": "1"}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def disk_of(work: Path, stage: Stage) -> int:
    """The stage's outs, and the store a pointer among them names."""
    total = 0
    for out in stage.outs:
        path = work / out
        total += tree_bytes(path)
        store = target_of(path)
        if store is not None:
            total += tree_bytes(store)
    return total


# The stage's processes are started by a small Python of their own, which writes the largest
# RSS among the children it waited for: a child started by this process would count this
# process's own memory (torch, the detector written) in its peak, as Linux counts a fork's.
MEASURE = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[2:]); "
           "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN)"
           ".ru_maxrss)); sys.exit(rc)")


def run_stage(work: Path, copy: Path, stage: Stage, env: dict[str, str]) -> Ran:
    """``capstack run STAGE`` as its own process; its wall time, the largest RSS among its
    processes and its GPU peak."""
    site = work / ".rehearsal"
    peak_file, rss_file = Path(env["CAPSTACK_REHEARSAL_GPU_PEAK"]), site / "rss_kb.txt"
    peak_file.unlink(missing_ok=True)
    argv = [sys.executable, "-I", "-c", MEASURE, str(rss_file), sys.executable,
            str(ROOT / "cli.py"), "run", stage.name, "-c", str(copy), "--workdir", str(work)]
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=work, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace")
    wall = time.perf_counter() - started
    log = work / "logs" / f"{stage.name.replace('/', '_')}.log"
    log.parent.mkdir(exist_ok=True)
    log.write_text(done.stdout)
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-30:])
        raise SystemExit(f"stage {stage.name} failed (exit {done.returncode}); its output "
                         f"({log}) ends:\n{tail}")
    peaks = [int(v) for v in peak_file.read_text().split()] if peak_file.exists() else []
    return Ran(stage.name, stage.command, wall, int(rss_file.read_text()) / 1024,
               max(peaks) / 2**20 if peaks else None, disk_of(work, stage), done.stdout)


# -- measuring against COCO ------------------------------------------------------------------
@dataclass
class Row:
    stage: str
    wall_s: float
    images: int | None  # images the stage processed (a training: over all its epochs)
    images_per_s: float | None
    rss_mb: float
    gpu_mb: float | None
    disk_mb: float
    full: str  # what the projection is of
    full_h: float | None
    needs_h: float | None
    full_gb: float | None
    needs_gb: float | None
    bound: bool = False  # full_h from the wall time, start-up included: at most that

    def differs(self) -> str:
        """Where the projection is more than FLAG from the estimate: ``time ×k``."""
        said = []
        for what, mine, theirs in (("time", self.full_h, self.needs_h),
                                   ("disk", self.full_gb, self.needs_gb)):
            if mine is not None and theirs:
                ratio = mine / theirs
                if abs(ratio - 1) > FLAG:
                    said.append(f"{what} ×{ratio:.3g}")
        return ", ".join(said) or ("within 25 %" if self.needs_h or self.needs_gb else "—")


EXTRACTED = re.compile(r"extracted (\d+) images \(([\d.]+) images/s\)")


def estimate(real: StagesFile, name: str) -> tuple[float | None, float | None]:
    """real_data_needs.py's hours and GB for the real stages file's stage ``name`` at COCO's
    size (a training's hours: one epoch's)."""
    stage = real.stage(name)
    if stage.command == "extract-regions":
        store = needs.region_store(stage, COCO.images)
        return store.extraction_h, store.gb
    if stage.command == "extract-grid":
        store = needs.grid_store(stage, COCO.images)
        return store.extraction_h, store.gb
    if stage.command == "train":
        run = needs.training(real, stage, COCO)
        return run.gpu_h / run.epochs, None
    if stage.command == "evaluate":
        return COCO.test / needs.BEAM_RATE.value / 3600, None
    return None, None


def measured(ran: Ran, stage: Stage, work: Path, data: dict, real: StagesFile) -> Row:
    """The run's figures, and each projected to COCO: work that grows with the images
    scaled by COCO's count over this one's, a training's epoch at its images/s."""
    n, train, test = data["images"], data["train_images"], data["splits"]["test"]
    disk_mb = ran.disk_bytes / 1e6
    images, rate, seconds = None, None, ran.wall_s
    full, full_h, full_gb = "as here", ran.wall_s / 3600, disk_mb / 1e3  # not scaled
    if stage.command in ("extract-regions", "extract-grid", "import-features", "prepare"):
        images, full, factor = n, f"{COCO.images:,} images", COCO.images / n
        found = EXTRACTED.search(ran.output)
        if found and float(found[2]) >= 1:  # printed to 0.1: below 1 too coarse, the wall's
            images, seconds = int(found[1]), int(found[1]) / float(found[2])
        full_gb = disk_mb / 1e3 * factor
    elif stage.command == "cider-cache":
        images, full, factor = train, f"{COCO.train:,} train images", COCO.train / train
        full_gb = disk_mb / 1e3 * factor
    elif stage.command == "train":
        summary = json.loads((work / stage.outs[0] / "summary.json").read_text())
        images, seconds = summary["epochs"] * train, summary["seconds"]
        full, factor = f"an epoch of {COCO.train:,}", COCO.train / images
    elif stage.command == "evaluate":  # its disk not scaled: mostly the figures of a few images
        images, full, factor = test, f"{COCO.test:,} test images", COCO.test / test
    else:
        factor = 1.0
    if images:
        rate = images / seconds
        full_h = seconds * factor / 3600
    needs_h, needs_gb = estimate(real, stage.name)
    return Row(stage.name, ran.wall_s, images, rate, ran.rss_mb, ran.gpu_mb, disk_mb, full,
               full_h, needs_h, full_gb, needs_gb, bound=bool(images) and seconds == ran.wall_s)


# -- printing --------------------------------------------------------------------------------
def figure(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}g}" if abs(value) < 10 ** digits else f"{value:,.0f}"


def table(rows: list[Row], device: str) -> str:
    lines = ["| stage | wall s | images | images/s | host peak MB | GPU peak MB | disk MB | "
             "at COCO's size | hours | needs h | GB | needs GB | differs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        gpu = "n/a (CPU)" if device == "cpu" else figure(r.gpu_mb, 4)
        hours = ("≤ " if r.bound else "") + figure(r.full_h)
        lines.append(
            f"| `{r.stage}` | {r.wall_s:.1f} | {r.images if r.images is not None else '—'} | "
            f"{figure(r.images_per_s)} | {r.rss_mb:,.0f} | {gpu} | {figure(r.disk_mb)} | "
            f"{r.full} | {hours} | {figure(r.needs_h)} | {figure(r.full_gb)} | "
            f"{figure(r.needs_gb)} | {r.differs()} |")
    return "\n".join(lines)


def heading(data: dict, vocab: int | None, device: str) -> str:
    import torch

    splits = ", ".join(f"{k} {v}" for k, v in data["splits"].items())
    threads = f", torch threads {torch.get_num_threads()}" if device == "cpu" else ""
    low, high = data["words_range"]
    return (f"device {device}{threads}; {data['images']} images ({splits}; "
            f"{data['portrait']} portrait), {data['jpeg_kb']:.0f} KB a JPEG; "
            f"{data['captions']} captions of {data['words_mean']:.1f} words ({low}-{high}); "
            f"vocabulary of prepare: {vocab if vocab is not None else '—'} words")


NOTES = """\
images/s: extraction's own figure, a training's images over its own seconds (summary.json),
else images over the wall time. hours and GB: the stage at COCO's size, work that grows with
the images scaled by COCO's count over this run's (≤: from the wall time, start-up counted as
per-image work); a training's hours: one epoch. needs: benchmarks/real_data_needs.py's GPU
estimate for the same stage; differs: where they are more than 25 % apart. Checkpoints,
evaluations and reports are not scaled."""


# -- the run ---------------------------------------------------------------------------------
def workdir_for(path: Path | None) -> Path:
    """A fresh workdir: a temporary folder, or ``path`` (empty, or a rehearsal's, cleared)."""
    if path is None:
        return Path(tempfile.mkdtemp(prefix="capstack-rehearsal-"))
    path = path.resolve()
    if path.exists() and any(path.iterdir()):
        if not (path / MARKER).exists():
            raise SystemExit(f"{path}: not empty and not a rehearsal's workdir; give an empty "
                             f"or new folder")
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def rehearse(work: Path, args: argparse.Namespace) -> dict:
    (work / MARKER).write_text(json.dumps({"images": args.images, "block": args.block}))
    copy = copy_stages_file(work)
    stages = load_stages_file(copy, capstack.commands)
    real = load_stages_file(STAGES_FILE, capstack.commands)
    order = [stages.stage(name) for name in run_order(stages, args.block, args.also)]
    started = time.perf_counter()
    data = write_dataset(work, args.images, args.seed)
    for dep in {d for s in order for d in s.deps if d.startswith("configs/")}:
        copy_experiment(work, dep)
    write_weights(work, order)
    print(f"inputs written in {time.perf_counter() - started:.0f} s: {work}", flush=True)
    env = environment(work, args.device)
    rows = []
    for stage in order:
        print(f"== {stage.name}", flush=True)
        ran = run_stage(work, copy, stage, env)
        rows.append(measured(ran, stage, work, data, real))
        print(f"   {ran.wall_s:.1f} s", flush=True)
    summary = work / "coco" / "prepared" / "summary.json"
    vocab = json.loads(summary.read_text())["vocab_size"] if summary.exists() else None
    return {"data": data, "vocab_size": vocab, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=8, help="images made (at least 4: one a split)")
    ap.add_argument("--block", default="tables_bottom_up",
                    help="the stage run with what it needs (--with-deps)")
    ap.add_argument("--also", action="append", default=[], metavar="STAGE",
                    help="another stage to run with what it needs (e.g. extract_grid)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where it runs [a temporary folder]; removed at the end unless --keep")
    ap.add_argument("--keep", action="store_true", help="keep the workdir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    if args.images < 4:
        ap.error("--images: at least 4 (train, restval, val and test need one each)")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            ap.error("--device cuda: no CUDA device here")
    work = workdir_for(args.workdir)
    try:
        result = rehearse(work, args)
    except BaseException:
        print(f"workdir kept, with each stage's log in logs/: {work}", file=sys.stderr)
        raise
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(heading(result["data"], result["vocab_size"], args.device))
    print(table(result["rows"], args.device))
    print()
    print(NOTES)
    if args.keep:
        print(f"workdir kept: {work}")
    if args.json:
        args.json.write_text(json.dumps({**result, "device": args.device,
                                         "rows": [asdict(r) for r in result["rows"]]},
                                        indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
