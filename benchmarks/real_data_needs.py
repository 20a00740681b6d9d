"""What each paper block of the real-data stages files needs: data, weights, GPU hours, disk.

Why: no paper block has run on COCO or Flickr yet, and whoever runs one first needs to know
what to fetch and how much GPU time and disk to book. These figures are estimates from
measured rates (docs/benchmarks.md), not runs.

How: for each ``tables_*`` stage of configs/coco.yaml, flickr8k.yaml and flickr30k.yaml, the
stages ``capstack run BLOCK --with-deps`` would run are read with capstack's own loader
(``load_stages_file``), each stage's command parsed by capstack's own CLI options, and each
training stage's experiment read with its ``--set`` overrides (``load_experiment``). Then:

- the dataset: the file name of the stages file's ``dataset_json`` (Karpathy's split files);
- extraction stores: grid cells x channels x 2 bytes (float16) an image; regions at the
  measured bytes an image of a COCO-size region store; extraction GPU hours = images / rate;
- training GPU hours = epochs x ceil(train images / batch size) x step time, top_down's
  measured step applied to every decoder (XE's for xe and interleaved_pretraining, SCST's for
  scst, c2f and adversarial), the row of the run's precision (``train.amp``: auto is bfloat16
  on CUDA).

    python benchmarks/real_data_needs.py [--json PATH]

No network, no GPU: it reads the configs and prints a markdown table.
"""

# (no `from __future__ import annotations`: the dataclasses below must build when the file is
# loaded outside sys.modules, as tests/test_benchmarks.py loads every script)

import argparse
import json
import math
import sys
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common import ROOT

import torch

from cli import main as capstack
from pipeline.engine.stagefile import Stage, StagesFile, load_stages_file
from pipeline.vision.backbones import grid_channels
from trainer.config import load_experiment
from trainer.precision import autocast_dtype

STAGES_FILES = ("configs/coco.yaml", "configs/flickr8k.yaml", "configs/flickr30k.yaml")


# -- the datasets ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Dataset:
    name: str
    train: int  # Karpathy's train split (COCO: restval counted as train, as `prepare` does)
    val: int
    test: int
    restval: int = 0  # of train: the images `prepare --restval drop` leaves out

    @property
    def images(self) -> int:
        return self.train + self.val + self.test


# Karpathy's split files (Karpathy & Fei-Fei 2015, caption_datasets.zip), whose sizes the
# stages files' headers state. COCO: 82,783 train + 30,504 restval, 5,000 val, 5,000 test of
# train2014 and val2014's 123,287. Flickr8k and Flickr30k: the splits cover 8,000 of the 8,091
# images of Flickr8k's release and 31,014 of Flickr30k's 31,783; extraction reads the json's.
DATASETS = {
    "dataset_coco.json": Dataset("COCO", train=113_287, val=5_000, test=5_000, restval=30_504),
    "dataset_flickr8k.json": Dataset("Flickr8k", train=6_000, val=1_000, test=1_000),
    "dataset_flickr30k.json": Dataset("Flickr30k", train=29_000, val=1_014, test=1_000),
}


# -- the measured rates (docs/benchmarks.md, "On a GPU") ---------------------------------------
@dataclass(frozen=True)
class Measured:
    value: float
    unit: str
    machine: str
    date: str
    commit: str
    how: str


H200 = "NVIDIA H200"
H100 = "NVIDIA H100 80GB HBM3"
# Extraction: "On a GPU" / "Extraction", the `extract-grid` and `extract-regions` loops.
GRID_RATE = Measured(95, "images/s", H200, "2026-11-26", "4e0ffa6",
                     "benchmarks/extraction.py --device cuda --images 64 --autocast bfloat16 "
                     "--batch 16 --workers 8: ResNet-101 at 448², the extract-grid loop")
REGION_RATE = Measured(2.1, "images/s", H200, "2026-11-26", "4e0ffa6",
                       "benchmarks/extraction.py --detector vg --device cuda --images 8 --batch 2 "
                       "--workers 4: the VG detector at 600×1000, random weights, the "
                       "extract-regions loop")
# Training: "On a GPU" / "Training throughput" (benchmarks/training.py --device cuda --hidden
# 1000 --scst --setups top_down:36:50,stack_cap:196:50 --steps 5), top_down on 36×2048 regions,
# 50 images × 5 captions a step, with the store reads ("step s"; the H200's rows give none).
STEP_SECONDS = {
    ("xe", "float32"): Measured(0.075, "s", H100, "2026-11-28", "83d74e3", "top_down XE step"),
    ("xe", "bfloat16"): Measured(0.080, "s", H100, "2026-11-28", "83d74e3", "top_down XE step"),
    ("scst", "float32"): Measured(0.139, "s", H100, "2026-11-28", "83d74e3",
                                  "top_down SCST step (5 samples + greedy)"),
    ("scst", "bfloat16"): Measured(0.119, "s", H100, "2026-11-28", "83d74e3",
                                   "top_down SCST step (5 samples + greedy)"),
}
# The same run's stack_cap on the 14×14×2048 grid, bfloat16: how far a grid decoder can be
# from top_down's figure.
GRID_DECODER_STEP = {"xe": Measured(0.187, "s", H100, "2026-11-28", "83d74e3", "stack_cap XE"),
                     "scst": Measured(0.228, "s", H100, "2026-11-28", "83d74e3",
                                      "stack_cap SCST")}
# Which measured step stands for each objective's step: XE's for those that teacher-force,
# SCST's for those that sample. Neither counts HACap's discriminator rounds.
STEP_OF_OBJECTIVE = {"xe": "xe", "interleaved_pretraining": "xe", "scst": "scst",
                     "c2f": "scst", "adversarial": "scst"}
# Beam search K=5 in batches of 50 images, top_down at COCO size (the same run, its
# --beam-images 1000).
BEAM_RATE = Measured(717, "images/s", H100, "2026-11-28", "83d74e3",
                     "beam search K=5, top_down, batches of 50 images")
# Disk: "COCO-size costs", a store of 10-100 regions (mean about 34) × 2,048 float16 an image,
# with boxes, scores and classes: 16.7 GB at 123,287 images (benchmarks/scale.py).
REGION_STORE_GB, REGION_STORE_IMAGES = 16.7, 123_287
FLOAT16_BYTES = 2
GB = 1e9

BACKBONE_NAMES = {"resnet101": "ResNet-101", "vgg19": "VGG-19"}
# torchvision's file names of its ImageNet weights (the stages files' params say which)
TORCHVISION_WEIGHTS = {"resnet101-63fe2227.pth": "IMAGENET1K_V1",
                       "resnet101-cd907fc2.pth": "IMAGENET1K_V2",
                       "vgg19-dcbb9e9d.pth": "IMAGENET1K_V1"}


# -- what a block needs ------------------------------------------------------------------------
@dataclass
class Store:
    stage: str
    kind: str  # grid or regions
    shape: str
    weights: str
    weights_file: str
    gb: float
    extraction_h: float


@dataclass
class Training:
    stage: str
    config: str
    objective: str
    precision: str
    epochs: int
    batch_size: int
    train_images: int
    step_s: float
    gpu_h: float
    decoding_h: float  # per-epoch validation and the final beam search, at the beam rate


@dataclass
class Block:
    stages_file: str
    block: str
    dataset: str
    images: int
    stores: list[Store] = field(default_factory=list)
    training: list[Training] = field(default_factory=list)

    @property
    def extraction_h(self) -> float:
        return sum(s.extraction_h for s in self.stores)

    @property
    def training_h(self) -> float:
        return sum(t.gpu_h for t in self.training)

    @property
    def total_h(self) -> float:
        return self.extraction_h + self.training_h

    @property
    def decoding_h(self) -> float:
        return sum(t.decoding_h for t in self.training)

    @property
    def disk_gb(self) -> float:
        return sum(s.gb for s in self.stores)

    def as_dict(self) -> dict:
        return {**asdict(self), "extraction_gpu_h": self.extraction_h,
                "training_gpu_h": self.training_h, "total_gpu_h": self.total_h,
                "decoding_gpu_h_left_out": self.decoding_h, "total_disk_gb": self.disk_gb}


def with_deps(stages: StagesFile, name: str) -> list[Stage]:
    """``name`` and every stage it needs, directly or not (``capstack run --with-deps``)."""
    needed, todo = {name}, [name]
    while todo:
        for up in stages.upstream[todo.pop()]:
            if up not in needed:
                needed.add(up)
                todo.append(up)
    return [stages.stage(s) for s in stages.order if s in needed]


def options(stage: Stage) -> dict:
    """The stage's capstack command line as the command's own options read it (defaults
    filled in), without running it."""
    command = capstack.commands[stage.command]
    return command.make_context(stage.command, list(stage.argv[1:]),
                                resilient_parsing=True).params


def grid_store(stage: Stage, images: int) -> Store:
    o = options(stage)
    dtype = o["dtype"] or "float16"
    channels = grid_channels(o["backbone"], o["layer"])
    per_image = o["grid"] ** 2 * channels * (FLOAT16_BYTES if dtype == "float16" else 4)
    name = BACKBONE_NAMES.get(o["backbone"], o["backbone"])
    file = Path(o["weights"]).name
    tag = TORCHVISION_WEIGHTS.get(file, "")
    return Store(stage.name, "grid", f"{o['grid']}×{o['grid']}×{channels} {dtype}",
                 f"ImageNet {name} {tag}".strip(), file, images * per_image / GB,
                 images / GRID_RATE.value / 3600)


def region_store(stage: Stage, images: int) -> Store:
    o = options(stage)
    if o["arch"] != "bottom-up":
        raise SystemExit(f"{stage.name}: no measured rate for --arch {o['arch']}")
    boxes = (str(o["min_boxes"]) if o["min_boxes"] == o["max_boxes"]
             else f"{o['min_boxes']}–{o['max_boxes']}")
    return Store(stage.name, "regions", f"{boxes}×2048 {o['dtype'] or 'float16'}",
                 "Visual Genome bottom-up detector", Path(o["weights"]).name,
                 images * REGION_STORE_GB / REGION_STORE_IMAGES,
                 images / REGION_RATE.value / 3600)


def train_images(stages: StagesFile, captions: str, dataset: Dataset) -> int:
    """The train images of the prepared captions folder ``captions``: all of Karpathy's train
    split, or without restval when the stage that wrote it dropped it."""
    writer = next(s for s in stages.stages.values() if captions in s.outs)
    dropped = options(writer)["restval"] == "drop"
    return dataset.train - (dataset.restval if dropped else 0)


def training(stages: StagesFile, stage: Stage, dataset: Dataset) -> Training:
    overrides = [a for a in stage.argv[2:] if "=" in a and not a.startswith("-")]
    config = load_experiment(ROOT / stage.argv[1], overrides)
    amp = autocast_dtype(config.train.amp, torch.device("cuda"))
    precision = "float32" if amp is None else str(amp).removeprefix("torch.")
    step = STEP_SECONDS[STEP_OF_OBJECTIVE[config.objective.name], precision]
    images = train_images(stages, config.data.captions, dataset)
    steps = config.train.epochs * math.ceil(images / config.train.batch_size)
    val = config.train.val_images or dataset.val
    decoded = config.train.epochs * val + dataset.test
    return Training(stage.name, stage.argv[1], config.objective.name, precision,
                    config.train.epochs, config.train.batch_size, images, step.value,
                    steps * step.value / 3600, decoded / BEAM_RATE.value / 3600)


def block_needs(path: str, stages: StagesFile, name: str) -> Block:
    dataset = DATASETS[Path(stages.params["dataset_json"]).name]
    block = Block(path, name, dataset.name, dataset.images)
    for stage in with_deps(stages, name):
        if stage.command == "extract-grid":
            block.stores.append(grid_store(stage, dataset.images))
        elif stage.command == "extract-regions":
            block.stores.append(region_store(stage, dataset.images))
        elif stage.command == "train":
            block.training.append(training(stages, stage, dataset))
    return block


def all_blocks() -> list[Block]:
    blocks = []
    for path in STAGES_FILES:
        stages = load_stages_file(ROOT / path, capstack.commands)
        blocks += [block_needs(path, stages, name) for name in stages.order
                   if name.startswith("tables_")]
    return blocks


# -- printing ----------------------------------------------------------------------------------
def hours(h: float) -> str:
    return f"{h:.2f}" if h < 1 else f"{h:.1f}"


def row(b: Block) -> str:
    weights = "; ".join(dict.fromkeys(f"{s.weights} (`{s.weights_file}`)" for s in b.stores))
    stores = "; ".join(f"{s.kind} {s.shape} ({s.gb:.1f} GB)" for s in b.stores)
    return (f"| `{b.block}` | {b.dataset} ({b.images:,}) | {weights} | {stores} | "
            f"{hours(b.extraction_h)} | {hours(b.training_h)} | "
            f"{hours(b.total_h)} | {b.disk_gb:.1f} GB |")


def caption() -> str:
    xe, scst = STEP_SECONDS["xe", "bfloat16"], STEP_SECONDS["scst", "bfloat16"]
    return (f"Estimates from measured rates, not runs. Extraction on an {GRID_RATE.machine} "
            f"({GRID_RATE.date}, commit {GRID_RATE.commit}): `extract-grid` "
            f"{GRID_RATE.value:g} images/s (ResNet-101 at 448², applied to every grid), "
            f"`extract-regions` {REGION_RATE.value:g} images/s (the VG detector at 600×1000, "
            f"random weights). Training on an {xe.machine} ({xe.date}, commit {xe.commit}): "
            f"top_down's step of 50 images in bfloat16, XE {xe.value:.3f} s and SCST "
            f"{scst.value:.3f} s, the top_down figure applied to all decoders and batch sizes.")


NOTES = (
    "- Extraction: the grid rate was measured with 8 decoding workers and the region rate "
    "with 4 (the stages' commands keep `--workers 2`); random weights are the detector's "
    "slowest case (no class reaches the threshold, so every (box, class) pair is ranked).",
    "- Disk: grids at 2 bytes a float16 value; regions at {per_image:.0f} KB an image, the "
    "measured {gb:g} GB store of 10–100 regions (mean about 34) at {n:,} images. Images, "
    "captions, checkpoints and the CIDEr-D cache are not counted.",
    "- Training: epochs × ⌈train images / batch size⌉ × step, every epoch run (early stopping "
    "can end one sooner). In the same run stack_cap's step on the 14×14×2048 grid took "
    "{grid_xe:.3f} s (XE) and {grid_scst:.3f} s (SCST): decoders attending over a grid may take "
    "about twice the hours shown. HACap's discriminator rounds have no measured figure and are "
    "not counted.",
    "- Left out: decoding (each epoch's validation and the test split's beam search, at the "
    "{beam:g} images/s of top_down's beam search, K=5, {machine}) would add at most "
    "{decoding} GPU h to a block.",
)


WIDTH = 100  # the caption's and notes' lines (the table's rows stay whole)


def table(blocks: list[Block]) -> str:
    lines = ["| block | dataset (images) | weights | stores (disk) | extraction GPU h | "
             "training GPU h | total GPU h | total disk |", "|---|---|---|---|---|---|---|---|"]
    lines += [row(b) for b in blocks]
    figures = dict(per_image=REGION_STORE_GB * GB / REGION_STORE_IMAGES / 1e3,
                   gb=REGION_STORE_GB, n=REGION_STORE_IMAGES, beam=BEAM_RATE.value,
                   machine=BEAM_RATE.machine, decoding=hours(max(b.decoding_h for b in blocks)),
                   grid_xe=GRID_DECODER_STEP["xe"].value,
                   grid_scst=GRID_DECODER_STEP["scst"].value)
    notes = [textwrap.fill(note.format(**figures), WIDTH, subsequent_indent="  ")
             for note in NOTES]
    return "\n".join([*lines, "", textwrap.fill(caption(), WIDTH), "", *notes])


def rates() -> dict:
    return {"extract_grid": asdict(GRID_RATE), "extract_regions": asdict(REGION_RATE),
            "beam_search": asdict(BEAM_RATE),
            "grid_decoder_step_seconds": {o: asdict(m) for o, m in GRID_DECODER_STEP.items()},
            "step_seconds": {f"{o} {p}": asdict(m) for (o, p), m in STEP_SECONDS.items()},
            "region_store": {"gb": REGION_STORE_GB, "images": REGION_STORE_IMAGES}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args(argv)
    blocks = all_blocks()
    print(table(blocks))
    if args.json:
        args.json.write_text(json.dumps({"caption": caption(), "rates": rates(),
                                         "blocks": [b.as_dict() for b in blocks]}, indent=1)
                             + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
