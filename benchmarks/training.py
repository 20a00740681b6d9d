"""Training step time and beam-search throughput, printed with ratios.

- XE training steps of ``top_down`` (hidden 512, 36x2048 regions, 50 images x 5
  captions) and ``soft_attention`` (196x2048 grid, 10 images x 5 captions), with
  the store reads included (TrainBatches over a real LMDB store) and excluded
  (one batch reused), and AMP on/off on a GPU.
- beam search (K = 5) captions/s, images x beams batched (50 images, as evaluation
  does), against a loop over one image at a time of the same code: a random
  COCO-size top_down, and the demo's trained decoders when `make demo` has run.

    python benchmarks/training.py [--steps 5] [--device cpu|cuda] [--images 200]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from pipeline.captions.prepared import Captions  # noqa: E402
from pipeline.captions.vocab import Vocabulary  # noqa: E402
from pipeline.features.extract.region_extraction import region_schema  # noqa: E402
from pipeline.features.stores import Record, Schema, create_writer, field  # noqa: E402
from trainer.data import Features, TrainBatches  # noqa: E402
from trainer.decode import beam_search  # noqa: E402
from trainer.decoders import DECODERS, build_decoder  # noqa: E402
from trainer.objectives import Setting, StepKey  # noqa: E402
from trainer.objectives.cross_entropy import CrossEntropy, CrossEntropyConfig  # noqa: E402

VOCAB = 9487  # COCO's vocabulary at min count 5, as in Stack-Cap
CAPTION_LEN = 16
COCO_SIZE = {"hidden": 512, "embed": 512, "att_hidden": 512}  # a decoder of the papers' size


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
    boxes = np.tile(np.array([[0, 0, 10, 10]], np.float32), (rows, 1)) if kind == "regions" else None
    extra = ({"boxes": boxes, "scores": np.ones(rows, np.float32),
              "classes": np.zeros(rows, np.int32)} if boxes is not None else {})
    with create_writer(path, meta) as w:
        for start in range(0, n_images, 50):
            w.write([(i, Record(block, 100, 100, **extra))
                     for i in range(start, min(n_images, start + 50))])
        w.finish()
    return path


def step_time(model, batches, device, steps: int, reuse_batch: bool, amp: bool) -> float:
    """Seconds per optimiser step, the first (warm-up) step excluded."""
    opt = torch.optim.Adam(model.parameters(), lr=4e-4)
    xe = CrossEntropy(CrossEntropyConfig(), Setting(captions=None, max_len=CAPTION_LEN))
    cast = torch.autocast("cuda", dtype=torch.bfloat16) if amp else nullcontext()
    it = batches.epoch(0)
    fixed = next(it).to(device)
    times = []
    for _ in range(steps + 1):
        started = time.perf_counter()
        batch = fixed if reuse_batch else next(it).to(device)
        with cast:
            loss, _ = xe.loss(model, batch, StepKey(0, 0, 0))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return float(np.mean(times[1:]))


def beam_rates(model, feats, mask, batch: int) -> tuple[float, float]:
    """Captions/s of beam search (K = 5) in batches of ``batch`` images, and one at a time."""
    model.eval()
    with torch.no_grad():
        started = time.perf_counter()
        for i in range(0, len(feats), batch):
            beam_search(model, model.encode(feats[i:i + batch], mask[i:i + batch]), 5, CAPTION_LEN)
        batched = len(feats) / (time.perf_counter() - started)
        started = time.perf_counter()
        for i in range(len(feats)):
            beam_search(model, model.encode(feats[i:i + 1], mask[i:i + 1]), 5, CAPTION_LEN)
        single = len(feats) / (time.perf_counter() - started)
    return batched, single


def beam_setups(images: int, device):
    """(label, model, feats, mask): a random COCO-size top_down, and the demo's trained decoders."""
    torch.manual_seed(0)
    model = build_decoder("top_down", DECODERS.get("top_down").Config(**COCO_SIZE), VOCAB,
                          2048).to(device)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--beam-images", type=int, default=200)
    ap.add_argument("--beam-batch", type=int, default=50, help="images per beam-search batch")
    args = ap.parse_args()
    device = torch.device(args.device)
    rng = np.random.default_rng(0)
    setups = [("top_down", 36, "regions", 50), ("soft_attention", 196, "grid", 10)]
    amps = [False, True] if device.type == "cuda" else [False]
    print(f"device: {device} ({torch.get_num_threads()} threads)")
    print(f"{'decoder':>15} {'features':>9} {'batch':>6} {'amp':>4} {'step s (data incl.)':>20} "
          f"{'step s (excl.)':>15} {'data share':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, rows, kind, batch_size in setups:
            n_images = batch_size * (args.steps + 2)
            store = synthetic_store(Path(tmp) / f"{name}.lmdb", n_images, rows, 2048, kind, rng)
            batches = TrainBatches(synthetic_captions(n_images, rng), Features([store]),
                                   batch_size=batch_size, seq_per_img=5, seed=0)
            for amp in amps:
                torch.manual_seed(0)
                model = build_decoder(name, DECODERS.get(name).Config(**COCO_SIZE),
                                      VOCAB, 2048).to(device)
                incl = step_time(model, batches, device, args.steps, reuse_batch=False, amp=amp)
                excl = step_time(model, batches, device, args.steps, reuse_batch=True, amp=amp)
                print(f"{name:>15} {f'{rows}x2048':>9} {f'{batch_size}x5':>6} {str(amp):>4} "
                      f"{incl:20.3f} {excl:15.3f} {max(incl - excl, 0) / incl:10.2f}")
    for label, model, feats, mask in beam_setups(args.beam_images, device):
        batched, single = beam_rates(model, feats, mask, args.beam_batch)
        print(f"beam search K=5, {label}: batches of {args.beam_batch} {batched:.0f} captions/s, "
              f"one image at a time {single:.0f}: {batched / single:.1f}x")


if __name__ == "__main__":
    main()
