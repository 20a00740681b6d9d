"""Train a small ResNet on a dataset's object labels: the demo's stand-in for ImageNet weights.

Random deep ResNets give meaningless (and float16-overflowing) features, and no
pretrained weights can be downloaded here. The shapes dataset records each
object's shape and colour in its ``boxes``; a ResNet trained to say which
shapes, colours and coloured shapes an image holds (multi-label, binary
cross-entropy) learns features that carry what the captions need. It is saved
as a plain torchvision state_dict, and the extractors load it through the same
``--weights PATH`` a COCO user passes ImageNet weights through.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pipeline.atomic import atomic_file
from pipeline.errors import CapstackError
from pipeline.extract.backbones import build_resnet
from pipeline.extract.images import ImageSkipped, grid_transform, load_rgb
from pipeline.karpathy import KarpathyImage, load_karpathy


@dataclass
class BackboneTraining:
    backbone: str = "resnet10"
    image_size: int = 128
    epochs: int = 3
    batch_size: int = 32
    lr: float = 1e-3
    seed: int = 0


def object_labels(image: KarpathyImage) -> set[str]:
    """'shape:circle', 'color:red', 'object:red circle' for every object in ``boxes``."""
    labels = set()
    for box in image.extra.get("boxes", []):
        shape, color = box.get("shape") or box.get("label"), box.get("color")
        if shape:
            labels.add(f"shape:{shape}")
        if color:
            labels.add(f"color:{color}")
        if shape and color:
            labels.add(f"object:{color} {shape}")
    return labels


def labelled_tensors(images, image_root: Path, label_index: dict[str, int], transform,
                     progress: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """All images decoded once (float16, transformed) and their multi-hot label rows.

    The demo's images are small: holding them in memory beats decoding them again
    every epoch in worker processes that compete with training for two cores."""
    from tqdm import tqdm

    x, y = [], torch.zeros(len(images), len(label_index))
    for k, im in enumerate(tqdm(images, desc="backbone: load images", disable=not progress)):
        path = image_root / im.relpath
        try:
            x.append(transform(load_rgb(path)).half())
        except ImageSkipped as e:
            raise CapstackError(f"{path}: cannot train on this image ({e.reason})") from None
        y[k, [label_index[l] for l in object_labels(im) if l in label_index]] = 1.0
    return torch.stack(x), y


def _batches(n: int, batch_size: int, generator: torch.Generator | None):
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]


@torch.no_grad()
def _evaluate(model, x, y, batch_size: int) -> dict:
    model.eval()
    correct = exact = 0
    for idx in _batches(len(x), batch_size, None):
        predicted = (model(x[idx].float()) > 0).float()
        correct += (predicted == y[idx]).sum().item()
        exact += (predicted == y[idx]).all(dim=1).sum().item()
    return {"label_accuracy": correct / max(y.numel(), 1), "exact_match": exact / max(len(y), 1)}


def train_backbone(dataset_json: Path, image_root: Path, out: Path, cfg: BackboneTraining,
                   progress: bool = True) -> dict:
    from tqdm import tqdm

    dataset = load_karpathy(dataset_json)
    train, val = dataset.split("train"), dataset.split("val")
    names = sorted({l for im in train for l in object_labels(im)})
    if not names:
        raise CapstackError(f"{dataset_json}: no object labels (images need a 'boxes' field "
                            f"with shape/color) to train a backbone on")
    index = {n: k for k, n in enumerate(names)}
    transform = grid_transform(cfg.image_size)
    x, y = labelled_tensors(train, image_root, index, transform, progress)
    generator = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model = build_resnet(cfg.backbone, num_classes=len(names))
    optimiser = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    history = []
    for epoch in range(cfg.epochs):
        model.train()
        losses = []
        for idx in tqdm(_batches(len(x), cfg.batch_size, generator),
                        desc=f"backbone epoch {epoch + 1}/{cfg.epochs}", disable=not progress):
            loss = loss_fn(model(x[idx].float()), y[idx])
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            losses.append(loss.item())
        history.append({"epoch": epoch + 1, "train_loss": float(np.mean(losses))})
    metrics = dict(history[-1])
    if val:
        vx, vy = labelled_tensors(val, image_root, index, transform, progress=False)
        metrics |= _evaluate(model, vx, vy, cfg.batch_size)
    with atomic_file(out) as tmp:
        torch.save(model.state_dict(), tmp)
    with atomic_file(Path(str(out) + ".json")) as tmp:
        tmp.write_text(json.dumps({"backbone": cfg.backbone, "labels": names,
                                   "config": cfg.__dict__, "history": history,
                                   "val": metrics}, indent=1))
    return {"out": str(out), "labels": len(names), **metrics}
