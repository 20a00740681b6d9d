"""Training step time and beam-search throughput, printed with ratios.

- XE (and with ``--scst``, SCST: 5 samples + the greedy baseline, CIDEr-D) training
  steps of each ``--setups`` decoder (default ``top_down``: 36x2048 regions, 50
  images x 5 captions; ``soft_attention``: a 196x2048 grid, 10 images x 5 captions;
  ``NAME:LOCATIONS:IMAGES`` for others), with the store reads included
  (TrainBatches over a real LMDB store, read ahead in pinned memory on a GPU as
  training does) and excluded (one batch reused), bfloat16 autocast off and on
  (``--amp``: on the CPU too), images/s, and on a GPU the share of the step's wall
  time the GPU is busy (the profiler's kernel time over the wall time). ``--readers
  0,2``: the steps with reads made in the trainer's process (0) and by N reader
  processes (``data.readers: N``), one row each; the data share is what the reads add.
  ``--compile off,steps``: the steps eager and with ``train.compile: steps`` (the decoder's
  recurrence and per-word step through torch.compile, ``--compile-mode``: auto is CUDA
  graphs on a GPU), one row each; a compiled row's first steps, which compile, are not timed.
- ``--count``: no timing; what one step asks of the device, counted on any device
  (trainer/launches.py): its operators (a kernel launch each on a GPU, eager), per decoding
  word, its host syncs, each with the line that asked for it, and its copies to the device
  (a CUDA graph holds no sync: the aim is one, the statistics' copy at the step's end, plus
  SCST's captions brought to the host for the reward).
- beam search (K = 5) captions/s, images x beams batched (50 images, as evaluation
  does), against a loop over one image at a time of the same code: a random
  COCO-size top_down, and the demo's trained decoders when `make demo` has run.

    python benchmarks/training.py [--steps 5] [--device cpu|cuda] [--hidden 512] [--scst]
        [--setups top_down,stack_cap:196:50] [--amp] [--beam-images 200] [--beam-single 0]
        [--readers 0,2] [--compile off,steps] [--compile-mode auto] [--count]

GPU.md's sizes: ``--device cuda --hidden 1000 --scst --setups top_down,stack_cap:196:50``.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import numpy as np

from common import ROOT

import torch
from torch.profiler import ProfilerActivity, profile

from pipeline.captions.prepared import Captions
from pipeline.captions.vocab import Vocabulary
from pipeline.features.extract.kinds.region_base import region_schema
from pipeline.features.stores import Record, Schema, create_writer, field
from trainer.data import Features, TrainBatches
from trainer.decode import beam_search
from trainer.decoders import DECODERS, build_decoder
from trainer.objectives import Objective, Setting, StepKey
from trainer.objectives.cross_entropy import CrossEntropy, CrossEntropyConfig
from trainer.objectives.scst import SelfCritical, SelfCriticalConfig
from trainer.precision import Precision
from trainer.read_ahead import read_ahead
from trainer.rewards.cider import CiderD
from trainer.launches import StepCount
from trainer.training.compiled import WARM_UP_CALLS, CompiledSteps, compile_mode
from trainer.training.loop import optimizer_step

VOCAB = 9487  # COCO's vocabulary at min count 5, as in Stack-Cap
CAPTION_LEN = 16
SETUPS = {"top_down": (36, 50), "soft_attention": (196, 10)}  # locations, images a batch


def synthetic_captions(n_images: int, rng) -> Captions:
    lengths = rng.integers(8, CAPTION_LEN, n_images * 5).astype(np.int32)
    labels = np.zeros((n_images * 5, CAPTION_LEN), np.int32)
    for k, n in enumerate(lengths):
        labels[k, :n] = rng.integers(4, VOCAB, n)
    starts = np.arange(n_images) * 5
    return Captions(Path("."), Vocabulary([f"w{i}" for i in range(VOCAB - 4)]), labels, lengths,
                    starts, starts + 5, np.arange(n_images), np.zeros(n_images, np.uint8))


def synthetic_store(path: Path, n_images: int, rows: int, dim: int, kind: str, rng) -> Path:
    schema = (region_schema(dim, "float16") if kind == "regions"
              else Schema((field("features", (dim,), "float16"),)))
    meta = {**schema.to_meta(), "producer": {"name": "benchmark", "settings": {}, "about": {}},
            "fingerprint": "bench", "capstack_version": "bench"}
    block = np.abs(rng.standard_normal((rows, dim))).astype(np.float16)
    boxes = (np.tile(np.array([[0, 0, 10, 10]], np.float32), (rows, 1))
             if kind == "regions" else None)
    extra = ({"boxes": boxes, "scores": np.ones(rows, np.float32),
              "classes": np.zeros(rows, np.int32)} if boxes is not None else {})
    with create_writer(path, meta) as w:
        for start in range(0, n_images, 50):
            w.write([(i, Record(block, 100, 100, **extra))
                     for i in range(start, min(n_images, start + 50))])
        w.finish()
    return path


def decoder_sizes(name: str, hidden: int) -> dict:
    """The decoder's widths at ``hidden`` (embeddings and attention too; the papers' 512)."""
    fields = {f.name for f in dataclasses.fields(DECODERS.get(name).Config)}
    return {k: hidden for k in ("hidden", "embed", "att_hidden") if k in fields}


def objectives(captions: Captions, scst: bool) -> dict:
    """XE, and SCST scored by CIDEr-D against the synthetic references."""
    setting = Setting(captions=captions, max_len=CAPTION_LEN)  # XE and SCST read none of it
    made: dict[str, Objective] = {"XE": CrossEntropy(CrossEntropyConfig(), setting)}
    if scst:
        words = captions.vocab.itow
        refs = {int(i): [" ".join(words[w] for w in captions.labels[k, :captions.lengths[k]])
                         for k in range(captions.label_start[r], captions.label_end[r])]
                for r, i in enumerate(captions.image_ids)}
        made["SCST"] = SelfCritical(SelfCriticalConfig(reward=None, samples=5), setting,
                                    scorer=CiderD.from_references(refs, words))
    return made


def step_time(model, objective, batches, device, steps: int, reuse_batch: bool, amp: bool,
              busy: bool = False, compiled: CompiledSteps | None = None
              ) -> tuple[float, float | None]:
    """Seconds per optimiser step, the first (warm-up) step excluded (the first three
    compiled: compiling, then CUDA graphs' warm-up and recording); and with ``busy`` on a
    GPU, the share of the timed steps' wall time that kernels ran."""
    opt = torch.optim.Adam(model.parameters(), lr=4e-4)
    precision = Precision("bfloat16" if amp else "off", device)
    it = iter(batches.epoch(0, pin_memory=device.type == "cuda") if batches.readers
              else read_ahead(batches.epoch(0), device))  # as trainer/training/loop.py reads
    fixed = next(it).to(device)

    def one_step():
        batch = fixed if reuse_batch else next(it).to(device)
        optimizer_step(partial(objective.loss, model), batch, StepKey(0, 0, 0), precision, opt,
                       0.1, compiled)  # training's own step, its statistics to the host

    for _ in range(1 if compiled is None else WARM_UP_CALLS):
        one_step()
    profiling = busy and device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA]) if profiling else nullcontext() as prof:
        started = time.perf_counter()
        for _ in range(steps):
            one_step()
        torch.cuda.synchronize() if device.type == "cuda" else None
        wall = (time.perf_counter() - started) / steps
    getattr(it, "close", lambda: None)()
    if not profiling:
        return wall, None
    assert prof is not None
    kernels = sum(e.self_device_time_total for e in prof.key_averages()) / 1e6 / steps
    return wall, kernels / wall


def page_cache_note(store: Path) -> str:
    """The store's size beside the memory available: whether its reads can come from the page
    cache (a COCO store of 36x2048 float16 regions is 17 GB, more than many machines cache)."""
    size = sum(f.stat().st_size for f in store.rglob("*") if f.is_file()) if store.is_dir() \
        else store.stat().st_size
    try:
        meminfo = Path("/proc/meminfo").read_text().split("\n")
        available = next(int(line.split()[1]) * 1024 for line in meminfo
                         if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return f"store {size / 1e9:.2f} GB (memory available unknown)"
    fits = "fits in the page cache: its reads come from memory" if size < available \
        else "is larger than the memory available: its reads come from the disk"
    return f"store {size / 1e9:.2f} GB, {available / 1e9:.0f} GB available: it {fits}"


def step_count(model, objective, batches, device) -> tuple[StepCount, int]:
    """What one training step (after a first one) asks of the device (trainer/launches.py),
    and its batch's caption width."""
    opt = torch.optim.Adam(model.parameters(), lr=4e-4)
    precision = Precision("off", device)
    batch = next(iter(batches.epoch(0))).to(device)
    for counting in (False, True):
        with StepCount() if counting else nullcontext() as count:
            optimizer_step(partial(objective.loss, model), batch, StepKey(0, 0, 0), precision,
                           opt, 0.1)
    return count, batch.width


def count_rows(args, device, rng) -> None:
    """``--count``: each setup's XE (and SCST) step counted, its syncs' places listed."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, rows, batch_size in parse_setups(args.setups):
            kind = "regions" if rows <= 100 else "grid"
            store = synthetic_store(Path(tmp) / f"{name}.lmdb", batch_size, rows, 2048, kind, rng)
            captions = synthetic_captions(batch_size, rng)
            for label, objective in objectives(captions, args.scst).items():
                batches = TrainBatches(captions, Features([store]), batch_size=batch_size,
                                       seq_per_img=5, seed=0)
                torch.manual_seed(0)
                model = build_decoder(name, DECODERS.get(name).Config(
                    **decoder_sizes(name, args.hidden)), VOCAB, 2048).to(device)
                count, width = step_count(model, objective, batches, device)
                # XE: the captions' words and <eos>; SCST: the sampled and greedy captions, each
                # max_len words and <eos> (random weights rarely end a caption sooner)
                words = 2 * (CAPTION_LEN + 1) if label == "SCST" else width - 1
                print(f"{name:>15} {label:>4} {count.operators:>9} {words:>5} "
                      f"{count.operators / words:>9.1f} {count.syncs:>5} {count.copies:>6}")
                for where, times in count.where().items():
                    print(f"{'':>21}sync x{times}: {where}")


def beam_rates(model, feats, mask, batch: int, single_images: int = -1) -> tuple[float, float]:
    """Images/s of beam search (K = 5) in batches of ``batch`` images, and one at a time (over
    the first ``single_images``; -1: all)."""
    model.eval()
    single_images = len(feats) if single_images < 0 else min(single_images, len(feats))
    with torch.no_grad():
        started = time.perf_counter()
        for i in range(0, len(feats), batch):
            beam_search(model, model.encode(feats[i:i + batch], mask[i:i + batch]), 5, CAPTION_LEN)
        synchronize(feats.device)
        batched = len(feats) / (time.perf_counter() - started)
        started = time.perf_counter()
        for i in range(single_images):
            beam_search(model, model.encode(feats[i:i + 1], mask[i:i + 1]), 5, CAPTION_LEN)
        synchronize(feats.device)
        single = single_images / max(time.perf_counter() - started, 1e-9)
    return batched, single


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def beam_setups(images: int, device):
    """(label, model, feats, mask): a random COCO-size top_down, and the demo's trained decoders."""
    torch.manual_seed(0)
    model = build_decoder("top_down", DECODERS.get("top_down").Config(
        **decoder_sizes("top_down", 512)), VOCAB, 2048).to(device)
    feats = torch.randn(images, 36, 2048, device=device).abs()
    yield ("top_down, random, COCO size (hidden 512, 36x2048, vocab 9487)", model, feats,
           torch.ones(images, 36, dtype=torch.bool, device=device))
    from pipeline.captions.prepared import load_captions
    from trainer.checkpoint import load_checkpoint
    from trainer.data import Features
    from trainer.evaluation.evaluate import load_model

    for name in ("show_tell", "soft_attention", "top_down"):
        run = ROOT / "runs" / name / "best.pt"
        if not run.is_file():
            continue  # `make demo` first
        ckpt = load_checkpoint(run)
        model, _, _ = load_model(ckpt)
        data = ckpt["experiment"]["data"]
        captions = load_captions(data["captions"])
        ids = captions.image_ids[captions.rows("test")][:images].tolist()
        feats, mask, _ = Features(data["features"], box_geometry=data["box_geometry"]).read(ids)
        yield (f"{name}, the demo's trained model, its test images", model.to(device),
               feats.to(device, torch.float32), mask.to(device))


def parse_setups(text: str) -> list[tuple[str, int, int]]:
    """``top_down,stack_cap:196:50`` -> [(decoder, locations, images a batch)]."""
    setups = []
    for item in text.split(","):
        name, *sizes = item.split(":")
        locations, images = map(int, sizes) if sizes else SETUPS[name]
        setups.append((name, locations, images))
    return setups


def step_rows(args, device, rng):
    """One printed row per (decoder, objective, precision)."""
    amps = [False, True] if device.type == "cuda" or args.amp else [False]
    with tempfile.TemporaryDirectory() as tmp:
        for name, rows, batch_size in parse_setups(args.setups):
            kind = "regions" if rows <= 100 else "grid"
            n_images = batch_size * (2 * args.steps + 2 * WARM_UP_CALLS + 2)
            store = synthetic_store(Path(tmp) / f"{name}.lmdb", n_images, rows, 2048, kind, rng)
            print(f"{name}: {page_cache_note(store)}")
            captions = synthetic_captions(n_images, rng)
            for label, objective in objectives(captions, args.scst).items():
                for amp, readers, compiling in ((a, r, c) for a in amps for r in args.readers
                                                for c in args.compile):
                    batches = TrainBatches(captions, Features([store]), batch_size=batch_size,
                                           seq_per_img=5, seed=0, readers=readers)
                    torch.manual_seed(0)
                    model = build_decoder(name, DECODERS.get(name).Config(
                        **decoder_sizes(name, args.hidden)), VOCAB, 2048).to(device)
                    compiled = None if compiling == "off" else CompiledSteps(
                        model, compile_mode(args.compile_mode, device))
                    incl, busy = step_time(model, objective, batches, device, args.steps,
                                           reuse_batch=False, amp=amp, busy=True,
                                           compiled=compiled)
                    excl, _ = step_time(model, objective, batches, device, args.steps,
                                        reuse_batch=True, amp=amp, compiled=compiled)
                    column = f" {readers:>7}" if args.readers != [0] else ""
                    if args.compile != ["off"]:
                        column += f" {compiling if compiled is None else compiled.mode:>15}"
                        if compiled is not None and compiled.failed:
                            column += f" (eager: {', '.join(compiled.failed)} failed)"
                    print(f"{name:>15} {label:>4} {f'{rows}x2048':>9} {f'{batch_size}x5':>6} "
                          f"{'bf16' if amp else 'fp32':>5}{column} {incl:9.3f} "
                          f"{batch_size / incl:9.1f} {excl:9.3f} "
                          f"{max(incl - excl, 0) / incl:10.2f} "
                          f"{'' if busy is None else f'{busy:8.2f}'}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--hidden", type=int, default=512, help="decoder widths (GPU.md: 1000)")
    ap.add_argument("--setups", default="top_down,soft_attention",
                    help="decoders, each NAME or NAME:LOCATIONS:IMAGES")
    ap.add_argument("--scst", action="store_true", help="SCST steps too")
    ap.add_argument("--amp", action="store_true", help="bfloat16 rows on the CPU too")
    ap.add_argument("--readers", type=lambda text: [int(n) for n in text.split(",")],
                    default=[0], help="data.readers values, one row each (e.g. 0,2)")
    ap.add_argument("--compile", type=lambda text: text.split(","), default=["off"],
                    help="train.compile values, one row each (off,steps)")
    ap.add_argument("--compile-mode", default="auto",
                    help="train.compile_mode of the compiled rows (auto: CUDA graphs on a GPU)")
    ap.add_argument("--beam-images", type=int, default=200, help="0: no beam search")
    ap.add_argument("--beam-batch", type=int, default=50, help="images per beam-search batch")
    ap.add_argument("--beam-single", type=int, default=-1,
                    help="images decoded one at a time for the ratio (default: all)")
    ap.add_argument("--count", action="store_true",
                    help="count each step's operators, host syncs and copies instead of timing")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if args.count:
        print(f"{'decoder':>15} {'step':>4} {'operators':>9} {'words':>5} {'per word':>9} "
              f"{'syncs':>5} {'copies':>6}")
        count_rows(args, device, np.random.default_rng(0))
        return
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {device} {name} ({torch.get_num_threads()} threads), torch {torch.__version__},"
          f" hidden {args.hidden}, vocabulary {VOCAB}")
    column = f" {'readers':>7}" if args.readers != [0] else ""
    column += f" {'compile':>15}" if args.compile != ["off"] else ""
    print(f"{'decoder':>15} {'step':>4} {'features':>9} {'batch':>6} {'amp':>5}{column} "
          f"{'step s':>9} {'images/s':>9} {'no-data s':>9} {'data share':>10} {'GPU busy':>8}")
    step_rows(args, device, np.random.default_rng(0))
    for label, model, feats, mask in beam_setups(args.beam_images, device) \
            if args.beam_images else []:  # --beam-images 0: the steps alone
        batched, single = beam_rates(model, feats, mask, args.beam_batch, args.beam_single)
        alone = f", one image at a time {single:.0f}: {batched / single:.1f}x" if single else ""
        print(f"beam search K=5, {label}: batches of {args.beam_batch} {batched:.0f} images/s"
              + alone)


if __name__ == "__main__":
    main()
