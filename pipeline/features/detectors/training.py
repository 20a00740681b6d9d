"""Train the bottom-up detector on a dataset's labelled boxes (the demo's own detector).

The network is the VG model's (Caffe ResNet C4, RoI pooling, attribute
branch), smaller: the shapes are 128-pixel drawings, not Visual Genome photos.
It learns from scratch with real batch norm, which the checkpoint saves as the
four tensors the frozen norm reads, so ``extract-regions --arch bottom-up``
loads it like a VG checkpoint. Objects are the ``label_key`` of each box (the
shapes), attributes its ``attribute_key`` (their colours), as the VG attribute
head learns colours among its 400 attributes. Targets and losses: :mod:`targets`;
quality on the test split: :mod:`quality`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import cast

import torch

from pipeline.captions.karpathy import (box_inside, box_label, box_where, image_box, image_boxes,
                                        load_karpathy)
from pipeline.core.errors import CapstackError, shown
from pipeline.core.jsonfile import write_json
from pipeline.features.detectors import quality, targets
from pipeline.features.detectors.caffe_resnet import ResNetShape
from pipeline.features.detectors.checkpoints import save_capstack
from pipeline.features.detectors.detector import BottomUpDetector, DetectorConfig
from pipeline.features.detectors.rpn import ProposalSettings, per_anchor
from pipeline.vision.images import ImageSkipped, load_rgb, pil_to_uint8


@dataclass
class DetectorTraining:
    label_key: str = "label"
    attribute_key: str | None = "attribute"
    # The attribute loss's weight in the sum. At 1 the colours, learned first, take the shared
    # features and the classes stay at chance for hundreds of steps (the demo: mAP@.5 0.09 after
    # 2 epochs, 0.68 without the attribute head); 0.2 is grid-feats-vqa's weight
    # (ROI_ATTRIBUTE_HEAD.LOSS_WEIGHT, "best per analysis").
    attribute_weight: float = 0.2
    blocks: tuple[int, int, int, int] = (1, 1, 1, 1)
    width: int = 8
    rpn_channels: int = 64
    image_size: int = 256  # shorter side (and longer at most): 128-pixel shapes at 2x
    anchor_scales: tuple[float, ...] = (2, 4, 8)  # x 16 px: 32 to 128 pixels
    proposals: int = 100  # kept after NMS, at test time (the VG model keeps 300)
    train_pre_nms: int = 600  # proposals ranked before NMS in training (NMS's cost grows ~n^2)
    train_proposals: int = 300
    rpn_batch: int = 128
    rois: int = 32  # sampled per image for the detection head
    epochs: int = 4
    batch_size: int = 8
    lr: float = 2e-3
    seed: int = 0


@dataclass
class Example:
    image: torch.Tensor  # uint8 [3, H, W]
    boxes: torch.Tensor  # float32 [G, 4]
    labels: torch.Tensor  # int64 [G], 1..
    attributes: torch.Tensor  # int64 [G], 1.. (0: none)

    def float_image(self) -> torch.Tensor:
        return self.image.float() / 255.0


def label_names(images, key: str | None, where: Path) -> list[str]:
    if key is None:
        return []
    names = {box_label(where, im, k, b, key) for im in images
             for k, b in enumerate(image_boxes(where, im))}
    return sorted(name for name in names if name is not None)


def examples(images, image_root: Path, objects: dict[str, int], attributes: dict[str, int],
             cfg: DetectorTraining, where: Path, progress: bool) -> list[Example]:
    """Every image with its labelled boxes, decoded once and kept in memory."""
    from tqdm import tqdm

    out = []
    for im in tqdm(images, desc="detector: read images", disable=not progress):
        path = image_root / im.relpath
        try:
            picture = load_rgb(path)
        except ImageSkipped as e:
            raise CapstackError(f"{path}: cannot train on this image ({e.reason})") from None
        boxes, labels, attrs = [], [], []
        for k, b in enumerate(image_boxes(where, im)):
            if not isinstance(b, dict) or "box" not in b:
                raise CapstackError(f"{where}: images[{im.index}] (imgid {im.imgid}).boxes[{k}]: "
                                    f'expected {{"box": [x1, y1, x2, y2], "{cfg.label_key}": '
                                    f"...}}, got {shown(b)}")
            box = image_box(where, im, k, b)
            box_inside(box_where(where, im, k), box, picture.width, picture.height)
            name = box_label(where, im, k, b, cfg.label_key)
            if name is None or name not in objects:
                continue  # unlabelled, or a label the train split never shows
            boxes.append(list(box))
            labels.append(objects[name])
            attrs.append(attributes.get(str(box_label(where, im, k, b, cfg.attribute_key)), 0)
                         if cfg.attribute_key else 0)
        out.append(Example(pil_to_uint8(picture), torch.tensor(boxes).reshape(-1, 4),
                           torch.tensor(labels, dtype=torch.int64),
                           torch.tensor(attrs, dtype=torch.int64)))
    return out


def detector_config(cfg: DetectorTraining, objects: int, attributes: int) -> DetectorConfig:
    blocks = cast("tuple[int, int, int, int]", tuple(cfg.blocks))  # four, as the field says
    return DetectorConfig(
        resnet=ResNetShape(blocks=blocks, width=cfg.width, stride_in_1x1=True,
                           caffe_maxpool=True, res5_stride=2, res5_dilation=1),
        num_classes=objects + 1, num_attributes=attributes + 1 if attributes else 0,
        rpn_channels=cfg.rpn_channels, attribute_embedding=32, attribute_hidden=64,
        proposals=ProposalSettings(pre_nms=1000, post_nms=cfg.proposals, min_size=4,
                                   scales=tuple(cfg.anchor_scales)),
        min_size=cfg.image_size, max_size=cfg.image_size)


def step_loss(model: BottomUpDetector, batch: list[Example], cfg: DetectorTraining,
              train_proposals: ProposalSettings) -> dict[str, torch.Tensor]:
    """The five losses of one batch (images of one size), each weighted as it is summed."""
    prepared = model.prepare([e.float_image() for e in batch])
    x = torch.stack([p for p, _ in prepared])
    fmap = model.backbone(x)  # [B, C, h, w]
    objectness, deltas = model.rpn(fmap)
    anchors = model.proposals.anchors(*fmap.shape[-2:])
    size = (x.shape[-2], x.shape[-1])
    losses: dict[str, list[torch.Tensor]] = {
        k: [] for k in ("rpn_objectness", "rpn_box", "classes", "box", "attributes")}
    rois, classes, matched, image_index = [], [], [], []
    for i, (example, (_, scale)) in enumerate(zip(batch, prepared)):
        gt = example.boxes * scale
        logits, d = per_anchor(objectness[i], deltas[i])
        o, b = targets.rpn_loss(logits, d, anchors, gt, size, cfg.rpn_batch)
        losses["rpn_objectness"].append(o)
        losses["rpn_box"].append(b)
        with torch.no_grad():
            proposals, _ = model.proposals(objectness[i], deltas[i], size, scale, train_proposals)
        r, c, m = targets.sample_rois(proposals, gt, example.labels, cfg.rois)
        rois.append(r)
        classes.append(c)
        matched.append((gt[m], example.attributes[m]))
        image_index.append(torch.full((len(r), 1), float(i)))
    all_rois = torch.cat(rois)
    features = model.box_head(fmap, torch.cat([torch.cat(image_index), all_rois], dim=1))
    class_logits, box_deltas = model.predictor(features)
    all_classes = torch.cat(classes)
    matched_boxes = torch.cat([m[0] for m in matched])
    c, b = targets.head_loss(class_logits, box_deltas, all_rois, all_classes, matched_boxes)
    out = {"rpn_objectness": torch.stack(losses["rpn_objectness"]).mean(),
           "rpn_box": torch.stack(losses["rpn_box"]).mean(), "classes": c, "box": b}
    if model.attributes is not None:
        wanted = torch.cat([m[1] for m in matched])
        labelled = (all_classes > 0) & (wanted > 0)
        if labelled.any():
            logits = model.attributes(features[labelled], all_classes[labelled])
            out["attributes"] = cfg.attribute_weight * torch.nn.functional.cross_entropy(
                logits, wanted[labelled])
    return out


def check_finite(losses: dict[str, torch.Tensor], epoch: int, number: int, images) -> None:
    """Stop at once, before anything is saved, when a loss is NaN or infinite: the weights
    would be NaN from this step on, and a detector of NaN weights finds nothing."""
    bad = {name: value.item() for name, value in losses.items()
           if not torch.isfinite(value).all()}
    if bad:
        said = ", ".join(f"{name} {value}" for name, value in bad.items())
        ids = ", ".join(str(im.image_id) for im in images)
        raise CapstackError(f"train-detector: epoch {epoch + 1}, batch {number + 1} (images "
                            f"{ids}): loss {said}; stopped before anything was saved (a lower "
                            f"--lr?)")


def evaluate(model: BottomUpDetector, split: list[Example], progress: bool) -> dict:
    from tqdm import tqdm

    model.eval()
    found = [quality.detect(model, e.float_image())
             for e in tqdm(split, desc="detector: test split", disable=not progress)]
    truth = [{"boxes": e.boxes, "labels": e.labels, "attributes": e.attributes} for e in split]
    metrics: dict = quality.coco_map(truth, found, model.config.num_classes)
    metrics["attribute_accuracy"] = quality.attribute_accuracy(truth, found)
    metrics["images"] = len(split)
    return metrics


def fold_box_stds(model: BottomUpDetector) -> None:
    """Trained on deltas divided by the stds: fold them into bbox_pred (as Caffe's snapshot
    does)."""
    with torch.no_grad():
        stds = torch.tensor(targets.BBOX_STDS).repeat(model.config.num_classes)
        model.predictor.bbox_pred.weight.mul_(stds[:, None])
        model.predictor.bbox_pred.bias.mul_(stds)


def train_detector(dataset_json: Path, image_root: Path, out: Path, cfg: DetectorTraining,
                   progress: bool = True) -> dict:
    from tqdm import tqdm

    dataset = load_karpathy(dataset_json)
    train = dataset.split("train")
    objects = label_names(train, cfg.label_key, dataset_json)
    attributes = label_names(train, cfg.attribute_key, dataset_json)
    if not objects:
        raise CapstackError(f"{dataset_json}: no boxes with a {cfg.label_key!r} in the train "
                            f"split to train a detector on")
    object_index = {n: k + 1 for k, n in enumerate(objects)}
    attribute_index = {n: k + 1 for k, n in enumerate(attributes)}
    train, train_set, unboxed = with_boxes(train, examples(
        train, Path(image_root), object_index, attribute_index, cfg, dataset_json, progress))
    test_set = examples(dataset.split("test"), Path(image_root), object_index, attribute_index,
                        cfg, dataset_json, False)
    torch.manual_seed(cfg.seed)
    model = BottomUpDetector(detector_config(cfg, len(objects), len(attributes)),
                             frozen_norm=False)
    optimiser = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    schedule = torch.optim.lr_scheduler.MultiStepLR(optimiser, [max(1, cfg.epochs - 1)], 0.1)
    train_proposals = replace(model.config.proposals, pre_nms=cfg.train_pre_nms,
                              post_nms=cfg.train_proposals)
    generator = torch.Generator().manual_seed(cfg.seed)
    history, started = [], time.perf_counter()
    for epoch in range(cfg.epochs):
        model.train()
        order = torch.randperm(len(train_set), generator=generator).tolist()
        batches = [order[i:i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
        sums: dict[str, float] = {}
        bar = tqdm(batches, desc=f"detector epoch {epoch + 1}/{cfg.epochs}", disable=not progress)
        for number, batch in enumerate(bar):
            losses = step_loss(model, [train_set[k] for k in batch], cfg, train_proposals)
            loss = cast(torch.Tensor, sum(losses.values()))  # four losses at least
            check_finite(losses, epoch, number, [train[k] for k in batch])
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            for k, v in losses.items():
                sums[k] = sums.get(k, 0.0) + v.item()
            bar.set_postfix(loss=f"{loss.item():.3f}")
        schedule.step()
        history.append({"epoch": epoch + 1, **{k: v / len(batches) for k, v in sums.items()}})
    seconds = time.perf_counter() - started
    fold_box_stds(model)
    metrics = evaluate(model, test_set, progress)
    # The checkpoint holds only what the same training always gives: its md5 names the feature
    # stores extracted with it, so a rerun must find them (no clock, no absolute path in it).
    about = {"dataset": str(dataset_json), "config": asdict(cfg), "history": history,
             "test": metrics}
    save_capstack(model, out, objects=objects, attributes=attributes or None, about=about)
    write_json(Path(str(out) + ".json"), {"objects": objects, "attributes": attributes, **about,
                                          "dataset": str(Path(dataset_json).resolve()),
                                          "train_seconds": round(seconds, 1)})
    return {"out": str(out), "objects": len(objects), "attributes": len(attributes),
            "train_seconds": seconds, "without_boxes": unboxed, **metrics}


def with_boxes(images: list, found: list[Example]) -> tuple[list, list[Example], int]:
    """The train images with a labelled box, their examples, and how many were left out: an
    image without one (``boxes: []``, or none labelled) has nothing to match proposals to,
    and the loss failed on it (as torchvision's detection references leave such images out)."""
    kept = [(im, e) for im, e in zip(images, found) if len(e.boxes)]
    return [im for im, _ in kept], [e for _, e in kept], len(images) - len(kept)
