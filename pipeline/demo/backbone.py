"""Train a small ResNet on a dataset's objects: the demo's stand-in for ImageNet weights.

Random deep ResNets give meaningless (and float16-overflowing) features, and no
pretrained weights can be downloaded here. The shapes dataset records each
object's box, shape and colour; a ResNet trained to name the shape and the
colour of each object crop (two softmax heads sharing one ``fc``) learns
object features that carry what the captions need, in a minute or two on a
CPU. It is saved as a plain torchvision state_dict, and the extractors load it
through the same ``--weights PATH`` a COCO user passes ImageNet weights
through (the ``fc`` layer is not used for features).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from pipeline.captions.karpathy import image_box, load_karpathy
from pipeline.core.atomic import atomic_file
from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import write_json
from pipeline.vision.backbones import build_resnet
from pipeline.vision.images import ImageSkipped, grid_transform, load_rgb


@dataclass
class BackboneTraining:
    backbone: str = "resnet10"
    crop_size: int = 64  # object crops are resized to this side
    epochs: int = 4
    batch_size: int = 64
    lr: float = 1e-3
    seed: int = 0


@dataclass
class ObjectCrops:
    images: torch.Tensor  # [N, 3, crop, crop] float16, normalised
    shapes: torch.Tensor  # [N] index into shape names
    colors: torch.Tensor  # [N] index into colour names


def _crop_box(box, width: int, height: int, margin: float = 0.15):
    """The object's box grown by ``margin`` on each side (some context), inside the image."""
    x1, y1, x2, y2 = box
    mx, my = (x2 - x1) * margin, (y2 - y1) * margin
    return (max(0, int(x1 - mx)), max(0, int(y1 - my)),
            min(width, int(np.ceil(x2 + mx))), min(height, int(np.ceil(y2 + my))))


def object_crops(images, image_root: Path, shape_index: dict, color_index: dict,
                 crop_size: int, progress: bool, where: Path) -> ObjectCrops:
    """Every labelled object of ``images`` as a normalised crop (decoded once, kept in memory);
    ``where``: the dataset json, named with a malformed box."""
    from tqdm import tqdm

    transform = grid_transform(crop_size)
    crops, shapes, colors = [], [], []
    for im in tqdm(images, desc="backbone: crop objects", disable=not progress):
        path = image_root / im.relpath
        try:
            picture = load_rgb(path)
        except ImageSkipped as e:
            raise CapstackError(f"{path}: cannot train on this image ({e.reason})") from None
        for k, obj in enumerate(im.extra.get("boxes", [])):
            if not isinstance(obj, dict):
                continue  # a bare [x1, y1, x2, y2]: no shape or colour to learn
            shape, color = obj.get("shape") or obj.get("label"), obj.get("color")
            if shape not in shape_index or color not in color_index:
                continue
            box = _crop_box(image_box(where, im, k, obj), picture.width, picture.height)
            crops.append(transform(picture.crop(box)).half())
            shapes.append(shape_index[shape])
            colors.append(color_index[color])
    return ObjectCrops(torch.stack(crops), torch.tensor(shapes), torch.tensor(colors))


def _names(images, key: str) -> list[str]:
    names = {(b.get(key) or (b.get("label") if key == "shape" else None))
             for im in images for b in im.extra.get("boxes", []) if isinstance(b, dict)}
    return sorted(name for name in names if name is not None)


def _batches(n: int, batch_size: int, generator: torch.Generator | None):
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]


def _loss(logits: torch.Tensor, crops: ObjectCrops, idx, n_shapes: int) -> torch.Tensor:
    return (F.cross_entropy(logits[:, :n_shapes], crops.shapes[idx])
            + F.cross_entropy(logits[:, n_shapes:], crops.colors[idx]))


@torch.no_grad()
def _accuracy(model, crops: ObjectCrops, n_shapes: int, batch_size: int) -> dict:
    model.eval()
    shape_ok = color_ok = 0
    for idx in _batches(len(crops.shapes), batch_size, None):
        logits = model(crops.images[idx].float())
        shape_ok += (logits[:, :n_shapes].argmax(1) == crops.shapes[idx]).sum().item()
        color_ok += (logits[:, n_shapes:].argmax(1) == crops.colors[idx]).sum().item()
    n = max(len(crops.shapes), 1)
    return {"shape_accuracy": shape_ok / n, "color_accuracy": color_ok / n}


def train_backbone(dataset_json: Path, image_root: Path, out: Path, cfg: BackboneTraining,
                   progress: bool = True) -> dict:
    from tqdm import tqdm

    dataset = load_karpathy(dataset_json)
    train, val = dataset.split("train"), dataset.split("val")
    shape_names, color_names = _names(train, "shape"), _names(train, "color")
    if not shape_names or not color_names:
        raise CapstackError(f"{dataset_json}: no labelled objects (images need 'boxes' with a "
                            f"box, a shape and a color) to train a backbone on")
    shape_index = {n: k for k, n in enumerate(shape_names)}
    color_index = {n: k for k, n in enumerate(color_names)}
    crops = object_crops(train, image_root, shape_index, color_index, cfg.crop_size, progress,
                         dataset_json)
    generator = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    n_shapes = len(shape_names)
    model = build_resnet(cfg.backbone, num_classes=n_shapes + len(color_names))
    optimiser = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    history = []
    for epoch in range(cfg.epochs):
        model.train()
        losses = []
        for idx in tqdm(_batches(len(crops.shapes), cfg.batch_size, generator),
                        desc=f"backbone epoch {epoch + 1}/{cfg.epochs}", disable=not progress):
            loss = _loss(model(crops.images[idx].float()), crops, idx, n_shapes)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            losses.append(loss.item())
        history.append({"epoch": epoch + 1, "train_loss": float(np.mean(losses))})
    metrics = {"objects": len(crops.shapes), **history[-1]}
    if val:
        held_out = object_crops(val, image_root, shape_index, color_index, cfg.crop_size, False,
                                dataset_json)
        metrics |= _accuracy(model, held_out, n_shapes, cfg.batch_size)
    with atomic_file(out) as tmp:
        torch.save(model.state_dict(), tmp)
    write_json(Path(str(out) + ".json"), {"backbone": cfg.backbone, "shapes": shape_names,
                                          "colors": color_names, "config": asdict(cfg),
                                          "history": history, "val": metrics})
    return {"out": str(out), "labels": n_shapes + len(color_names), **metrics}
