"""Scale-out: training and extraction images/s with 1 and N processes (torchrun), and where the
time of a DDP step goes.

- Training: ``capstack train`` of a COCO-size ``top_down`` (hidden 512, 36x2048 region features,
  batches of 50 images x 5 captions) on the shapes captions and a synthetic region store,
  run as 1 process and as N (``--nproc``, gloo on the CPU, NCCL on GPUs). Images/s from the
  run's own step log (first step excluded); each step split into data (store reads),
  forward and backward (DDP's gradient all-reduce overlaps the backward); the all-reduce of
  the model's gradients alone is timed in the same processes.
- Extraction: ``capstack extract-grid`` (ResNet, random weights) as 1 and N processes: the
  images/s of the extraction (slowest rank) and the wall time with start-up and merge.

On a CPU, N processes share the cores one process would use with N threads, so the
efficiency measures how well the work splits, not more hardware. With ``--device cuda``
each process takes its own GPU.

    python benchmarks/distributed.py [--nproc 2] [--steps 6] [--images 120] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import common  # this checkout importable  # noqa: F401

BATCH = 50
HIDDEN = 512


IDEAL = {True: "on the CPU the processes share the cores one process threads over",
         False: "one GPU a process"}


def ideal_speedup(nproc: int, device: str) -> float:
    """N processes on N GPUs: N; on the CPU: as many cores as one process already used."""
    if device != "cpu":
        return float(nproc)
    import torch
    return max(1.0, min(nproc, os.cpu_count() or 1) / torch.get_num_threads())


def prepare_training(folder: Path, steps: int) -> Path:
    """Shapes captions for ``steps`` batches, a synthetic 36x2048 region store, an experiment."""
    import yaml

    from pipeline.captions.prepare import prepare_captions
    from pipeline.captions.prepared import load_captions
    from pipeline.demo.shapes import write_shapes_dataset
    from pipeline.features.stores import Record, create_writer

    write_shapes_dataset(folder / "shapes", n_train=BATCH * steps, n_val=10, n_test=2, seed=0,
                         size=32)
    prepare_captions(folder / "shapes" / "dataset_shapes.json", folder / "prepared", min_count=1)
    rng = np.random.default_rng(0)
    from pipeline.features.extract.kinds.region_base import region_schema

    meta = {**region_schema(2048, "float16").to_meta(),
            "producer": {"name": "benchmark", "settings": {}, "about": {}},
            "fingerprint": "bench", "capstack_version": "bench"}
    boxes = np.tile(np.array([[0, 0, 10, 10]], np.float32), (36, 1))
    with create_writer(folder / "regions.lmdb", meta) as writer:
        for i in load_captions(folder / "prepared").image_ids:
            writer.write([(int(i),
                           Record(np.abs(rng.standard_normal((36, 2048))).astype(np.float16),
                                  32, 32, boxes=boxes, scores=np.ones(36, np.float32),
                                  classes=np.zeros(36, np.int32)))])
        writer.finish()
    exp = folder / "top_down.yaml"
    exp.write_text(yaml.safe_dump({
        "name": "top_down",
        "decoder": {"name": "top_down", "embed": HIDDEN, "hidden": HIDDEN, "att_hidden": HIDDEN},
        "data": {"captions": str(folder / "prepared"), "features": [str(folder / "regions.lmdb")]},
        "train": {"epochs": 1, "batch_size": BATCH, "log_every": 1, "val_images": 10}}))
    return exp


def train_figures(exp: Path, out: Path, nproc: int, device: str) -> dict:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cli", "train", str(exp), "--out", str(out),
                    "--nproc", str(nproc), "--set", f"train.device={device}"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()
             if '"train"' in x][1:]  # the first step warms up
    seconds = steps[-1]["time"] - steps[0]["time"]
    per_step = seconds / (len(steps) - 1)
    forward = float(np.mean([s["time_forward"] for s in steps[1:]]))
    backward = float(np.mean([s["time_backward"] for s in steps[1:]]))
    return {"images_per_s": BATCH * (len(steps) - 1) / seconds, "step": per_step,
            "forward": forward, "backward": backward,
            "data": max(per_step - forward - backward, 0.0), "wall": wall}


def allreduce_probe() -> None:
    """Under torchrun: seconds of one all-reduce of top_down's gradients (gloo), printed by
    rank 0."""
    import torch
    import torch.distributed as dist

    from trainer.decoders import build_decoder
    from trainer.decoders.top_down import TopDownConfig

    dist.init_process_group("gloo")
    model = build_decoder("top_down", TopDownConfig(embed=HIDDEN, hidden=HIDDEN, att_hidden=HIDDEN),
                          60, 2048)
    grads = torch.zeros(sum(p.numel() for p in model.parameters()))
    times = []
    for _ in range(6):
        started = time.perf_counter()
        dist.all_reduce(grads)
        times.append(time.perf_counter() - started)
    if dist.get_rank() == 0:
        print(json.dumps({"allreduce_s": float(np.median(times[1:])),
                          "params": int(grads.numel())}))
    dist.destroy_process_group()


def allreduce_seconds(nproc: int) -> dict:
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={nproc}", __file__, "--allreduce-probe"],
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def extraction_figures(folder: Path, nproc: int, images: int, device: str) -> dict:
    from pipeline.demo.shapes import write_shapes_dataset

    data = folder / "images"
    if not data.exists():
        write_shapes_dataset(data, n_train=images, n_val=0, n_test=0, seed=0, size=224)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "cli", "extract-grid",
                           str(data / "dataset_shapes.json"), str(data), "--backbone", "resnet18",
                           "--weights", "random", "--image-size", "224", "--grid", "7",
                           "--batch", "8", "--workers", "1", "--nproc", str(nproc),
                           "--features-root", str(folder / f"features{nproc}"),
                           "--device", device], check=True, capture_output=True, text=True)
    wall = time.perf_counter() - started
    rate = float(re.search(r"\(([\d.]+) images/s\)", done.stdout).group(1))
    return {"images_per_s": rate, "wall": wall}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6, help="training batches of 50 images")
    ap.add_argument("--images", type=int, default=120, help="images to extract")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (one GPU per process)")
    ap.add_argument("--allreduce-probe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.allreduce_probe:
        return allreduce_probe()
    print(f"device {args.device}, {os.cpu_count()} CPU cores; processes 1 and {args.nproc}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        exp = prepare_training(tmp / "train", args.steps)
        runs = {n: train_figures(exp, tmp / f"run{n}", n, args.device) for n in (1, args.nproc)}
        reduce = allreduce_seconds(args.nproc)
        print(f"\ntraining: top_down hidden {HIDDEN}, 36x2048 regions, {BATCH} images x 5 captions "
              f"a step, {reduce['params'] / 1e6:.1f} M parameters")
        print(f"{'processes':>9} {'images/s':>9} {'step s':>7} {'data':>6} {'forward':>8} "
              f"{'backward':>9} {'wall s':>7}")
        for n, r in runs.items():
            print(f"{n:>9} {r['images_per_s']:9.1f} {r['step']:7.2f} {r['data']:6.2f} "
                  f"{r['forward']:8.2f} {r['backward']:9.2f} {r['wall']:7.1f}")
        one, many = runs[1], runs[args.nproc]
        print(f"gradient all-reduce alone ({args.nproc} processes, gloo): "
              f"{reduce['allreduce_s'] * 1e3:.1f} ms a step "
              f"({reduce['allreduce_s'] / many['step']:.1%} of the {args.nproc}-process step)")
        ideal = ideal_speedup(args.nproc, args.device)
        speedup = many["images_per_s"] / one["images_per_s"]
        print(f"training speedup: {speedup:.2f}x; scaling efficiency: {speedup / ideal:.0%} "
              f"(of the ideal {ideal:.2f}x: {IDEAL[args.device == 'cpu']})")
        ext = {n: extraction_figures(tmp / "extract", n, args.images, args.device)
               for n in (1, args.nproc)}
        print(f"\nextraction: resnet18 at 224 px, grid 7, {args.images} images")
        print(f"{'processes':>9} {'images/s':>9} {'wall s':>7}")
        for n, r in ext.items():
            print(f"{n:>9} {r['images_per_s']:9.1f} {r['wall']:7.1f}")
        speedup = ext[args.nproc]["images_per_s"] / ext[1]["images_per_s"]
        print(f"extraction speedup: {speedup:.2f}x; scaling efficiency: {speedup / ideal:.0%}")


if __name__ == "__main__":
    main()
