"""Extraction: images/s of extract-grid (or the VG region detector) against the forward pass alone.

The pipeline (decode + resize in DataLoader workers, forward, float16 store
writes) should keep the backbone >= 90 % busy: its images/s over the forward
pass's images/s on preloaded tensors of the same batch size. The loop runs twice:
overlapped (commits in a writer thread ``--write-ahead`` batches behind the
forward pass, as extraction does) and serial (``write_ahead=0``: each batch
committed before the next is read), each into its own store; the two stores'
records are compared byte for byte. Images are 640x480 JPEGs (COCO-like) drawn
here; weights are random (``--dtype float32`` because a random ResNet-101's
activations overflow float16).

    python benchmarks/extraction.py [--images 64] [--backbone resnet101] [--image-size 448]
        [--batch 16] [--workers 2] [--write-ahead 2] [--device cuda]

On a GPU: ``--images 1000 --workers 14 --device cuda`` (benchmarks/gpu_checklist.sh).

``--decode device``: the loop as ``extract-grid --decode device`` runs it: the workers only
read the JPEGs' bytes, and each batch is decoded (nvJPEG on CUDA), resized and normalised on
the device in the loop's thread; the target is then >= 80 % of the forward pass alone.

``--detector vg``: the Visual Genome bottom-up detector at its real size
(ResNet-101 C4, 1601 classes, 401 attributes, 600x1000, 10-100 boxes; random
weights in MILVLG's naming, written by benchmarks/vg_checkpoints.py): images/s
of extract-regions against the forward pass alone, and the forward pass split
into backbone (res2-res4), RPN (head, decoding, NMS), RoI pooling + res5 +
predictors, and the region selection; writing is the loop's time beyond them.

    python benchmarks/extraction.py --detector vg [--images 4] [--batch 2] [--device cuda]

``--autocast bfloat16``: a random ResNet-101's activations overflow float16 on a GPU (NaN
features, refused by the store): the forward passes then autocast to bfloat16 instead of the
pipeline's float16, at the same tensor-core speed on Ampere and later GPUs.

``--against-cpu N``: the first N images extracted again on the CPU with the same weights, and
the largest difference between the two stores' features (and, for regions, boxes) printed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import write_images

import torch

from pipeline.core.ranks import pick_device
from pipeline.features.stores import open_store
from pipeline.vision.backbones import (load_resnet, resnet_body,
                                                 resolve_weights)
from pipeline.features.extract.kinds.grid import GridExtractor, GridSettings, extract_grid
from pipeline.features.extract.runner import autocast
from pipeline.vision.jpeg import DECODES



def forward_only(args, device) -> float:
    weights = resolve_weights(args.backbone, "random")
    model = GridExtractor(resnet_body(load_resnet(args.backbone, weights)), args.grid).eval()
    model = model.to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    x = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device)
    if device.type == "cuda":
        x = x.contiguous(memory_format=torch.channels_last)
    n_batches = max(1, args.images // args.batch)
    with torch.inference_mode(), autocast(device):
        model(x)  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(n_batches):
            model(x).float().cpu()
        if device.type == "cuda":
            torch.cuda.synchronize()
    return n_batches * args.batch / (time.perf_counter() - started)


def vg_phases(extractor, images: list[torch.Tensor], device) -> dict[str, float]:
    """Seconds per phase of the bottom-up forward pass over ``images`` (one at a time)."""
    from pipeline.features.detectors.boxes import inclusive
    from pipeline.features.detectors.selection import select_regions

    detector = extractor.detector
    phases = dict.fromkeys(["backbone", "rpn", "roi_res5", "selection"], 0.0)

    def timed(name, fn, *args):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        out = fn(*args)
        if device.type == "cuda":
            torch.cuda.synchronize()
        phases[name] += time.perf_counter() - started
        return out

    def proposals(fmap, x, scale):
        return detector.proposals(
            *[t[0] for t in detector.rpn(fmap[None])], tuple(x.shape[-2:]), scale)

    def selection(boxes, scale, probs):
        return select_regions(
            inclusive(boxes / scale), probs[:, 1:], nms_thresh=0.3, conf_thresh=0.2,
            min_boxes=10, max_boxes=100)

    with torch.inference_mode(), autocast(device):
        for image in images:
            [(x, scale)] = detector.prepare([image.to(device)])
            [fmap] = timed("backbone", detector.res4, [x])
            boxes, _ = timed("rpn", proposals, fmap, x, scale)
            _, probs, _, _ = timed("roi_res5", detector.describe, fmap, boxes)
            timed("selection", selection, boxes, scale, probs)
    return phases


def vg_benchmark(args, device) -> None:
    from benchmarks.vg_checkpoints import random_vg_detector, write

    from pipeline.vision.images import DetectorTransform, load_rgb
    from pipeline.features.extract.region_extraction import (RegionSettings, build_extractor,
                                                             extract_regions)

    print(f"device {device}, torch threads {torch.get_num_threads()}, VG bottom-up R101 C4 "
          f"600x1000, batch {args.batch}, {args.workers} workers, {args.images} images")
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        dataset = write_images(tmp, args.images)
        checkpoint = write(random_vg_detector(), "bua-caffe", tmp)
        settings = RegionSettings(arch="bottom-up", weights=str(checkpoint), dtype="float32")
        extractor = build_extractor(settings, str(checkpoint)).to(device)
        transform = DetectorTransform()
        images = [transform(load_rgb(tmp / "images" / f"{i:05d}.jpg")) for i in range(args.images)]
        vg_phases(extractor, images[:1], device)  # warm-up
        phases = vg_phases(extractor, images, device)
        forward = sum(phases.values())
        print(f"forward pass alone (decoded images): {args.images / forward:8.3f} images/s")
        for name, seconds in phases.items():
            print(f"  {name:10s} {seconds / args.images * 1000:9.1f} ms/image  "
                  f"{seconds / forward:6.1%}")
        warm = write_images(tmp / "warm-up", 1)  # the loop warm, as the phases were measured
        extract_regions(warm, tmp / "warm-up", settings, root=tmp / "warm-up" / "features",
                        batch_size=1, workers=0, device=args.device, progress=False)
        started = time.perf_counter()
        result = extract_regions(dataset, tmp, settings, root=tmp / "features",
                                 batch_size=args.batch, workers=args.workers,
                                 device=args.device, progress=False)
        total = time.perf_counter() - started
        print(f"extract-regions loop (decode, forward, write): {result.images_per_s:8.3f} "
              f"images/s  (whole command incl. checkpoint load and hashing: "
              f"{args.images / total:.3f})")
        print(f"forward pass: {result.images_per_s / (args.images / forward):.1%} of the loop's "
              f"wall time (decoding, batching and writing: the rest)")
        if args.against_cpu:
            against_cpu(args, tmp, lambda data, root, device: extract_regions(
                data, data.parent, settings, root=root, batch_size=args.batch, workers=0,
                device=device, progress=False))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--backbone", default="resnet101")
    ap.add_argument("--image-size", type=int, default=448)
    ap.add_argument("--grid", type=int, default=14)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--write-ahead", type=int, default=2,
                    help="batches the forward pass may run ahead of the commits")
    ap.add_argument("--device", default=None)
    ap.add_argument("--decode", choices=DECODES, default="cpu",
                    help="where the loop decodes the JPEGs: PIL in the workers (cpu) or the "
                         "device, a batch at once (extract-grid --decode)")
    ap.add_argument("--against-cpu", type=int, default=0, metavar="N",
                    help="the first N images on the CPU too: the stores' largest difference")
    ap.add_argument("--detector", choices=["vg"], default=None,
                    help="benchmark the VG bottom-up region detector instead of the grid")
    ap.add_argument("--autocast", choices=["float16", "bfloat16"], default="float16",
                    help="the CUDA autocast dtype (random weights overflow float16)")
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    use_autocast(args.autocast)
    if args.detector == "vg":
        return vg_benchmark(args, device)
    print(f"device {device}, autocast {args.autocast if device.type == 'cuda' else 'none'}, "
          f"torch threads {torch.get_num_threads()}, {args.backbone} "
          f"{args.image_size}px, batch {args.batch}, {args.workers} workers, decode "
          f"{args.decode}, {args.images} images")
    with tempfile.TemporaryDirectory() as tmp:
        dataset = write_images(Path(tmp), args.images)
        forward = forward_only(args, device)
        print(f"forward pass alone (preloaded tensors): {forward:8.2f} images/s")
        settings = GridSettings(args.backbone, "random", args.image_size, args.grid, "float32",
                                decode=args.decode)
        stores = {}
        for label, ahead in [("overlapped", args.write_ahead), ("serial", 0)]:
            started = time.perf_counter()
            result = extract_grid(dataset, Path(tmp), settings,
                                  root=Path(tmp) / f"features-{label}", batch_size=args.batch,
                                  workers=args.workers, device=args.device, progress=False,
                                  write_ahead=ahead)
            total = time.perf_counter() - started
            stores[label] = result.store
            print(f"extract-grid loop, {label} (write-ahead {ahead}): "
                  f"{result.images_per_s:8.2f} images/s  (whole command incl. model build and "
                  f"hashing: {args.images / total:.2f}); backbone busy "
                  f"{result.images_per_s / forward:.1%} of the forward-only rate")
        print(f"stores of the two loops: {same_records(*stores.values())}")
        if args.against_cpu:
            against_cpu(args, Path(tmp), lambda data, root, device: extract_grid(
                data, data.parent, settings, root=root, batch_size=args.batch, workers=0,
                device=device, progress=False))


def same_records(first: Path, second: Path) -> str:
    """Whether two stores hold the same records, byte for byte (every field)."""
    a, b = open_store(first), open_store(second)
    if list(a.ids()) != list(b.ids()):
        return "DIFFERENT image ids"
    for i in a.ids():
        x, y = a.get(int(i)), b.get(int(i))
        if any(x.fields[n].tobytes() != y.fields[n].tobytes() for n in x.fields):
            return f"DIFFERENT records (image {int(i)} first)"
    return f"identical ({len(a)} records)"


def use_autocast(name: str) -> None:
    """The pipeline's CUDA autocast in ``name`` (float16 is the pipeline's own) for this run."""
    import pipeline.features.extract.kinds.grid as grid_module
    import pipeline.features.extract.region_extraction as region_module

    dtype = getattr(torch, name)

    def cast(device: torch.device, half: bool = True):  # ``half``: bfloat16 holds random weights
        return torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda")

    for module in (grid_module, region_module, sys.modules[__name__]):
        module.__dict__["autocast"] = cast


def against_cpu(args, tmp: Path, extract) -> None:
    """The first ``args.against_cpu`` images extracted on ``args.device`` and on the CPU by
    ``extract(dataset, features_root, device) -> JobResult``: the largest differences of
    their stores."""
    data = write_images(tmp / "against-cpu", args.against_cpu)
    stores = [extract(data, tmp / "against-cpu" / f"features-{device}", device).store
              for device in (args.device, "cpu")]
    readers = [open_store(store) for store in stores]
    for name in ("features", "boxes"):
        if name not in readers[0].schema.names:
            continue
        gap, top, unlike = 0.0, 0.0, 0
        for i in readers[0].ids():
            there, here = (r.get(int(i)).fields[name].astype(np.float64) for r in readers)
            if there.shape != here.shape:
                unlike += 1  # another number of regions kept
                continue
            gap, top = max(gap, np.abs(there - here).max()), max(top, np.abs(here).max())
        if unlike:
            print(f"{name}: {unlike} images keep another number of regions on {args.device}")
        print(f"{name} on {args.device} against cpu, {args.against_cpu} images: largest "
              f"difference {gap:.3g} (largest value {top:.3g}, "
              f"relative {gap / max(top, 1e-30):.2g})")


if __name__ == "__main__":
    main()
