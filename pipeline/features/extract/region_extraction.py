"""extract-regions: a dataset's images -> bottom-up region features in a shared store.

Boxes are detected (``--boxes detect``: the bottom-up rule, 10-100 adaptive or
a fixed 36 with min = max) or taken from the dataset json (``--boxes given``:
each image's ``boxes`` field, e.g. the shapes' objects or another detector's
boxes), and described by a detector: ``--arch bottom-up``, the Visual Genome
bottom-up model (:mod:`pipeline.features.detectors`, a VG checkpoint or one
``capstack train-detector`` wrote; its regions also carry object and attribute
labels), or a torchvision Faster R-CNN (``fpn``, ``c4``, ``c5``:
:mod:`pipeline.features.extract.regions`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.captions.karpathy import load_karpathy
from pipeline.core.errors import CapstackError
from pipeline.core.hashing import md5_of_file
from pipeline.core.ranks import pick_device
from pipeline.features.detectors.checkpoints import (LoadedDetector, load_detector,
                                                     missing_checkpoint)
from pipeline.features.detectors.regions import BottomUpRegions
from pipeline.features.detectors.vocabulary import label_names
from pipeline.features.extract.backbones import RANDOM, RANDOM_SEED, resolve_weights
from pipeline.features.extract.images import detector_transform
from pipeline.features.extract.job import ExtractionJob, JobResult, run_job
from pipeline.features.extract.regions import (RegionFeatureExtractor, build_detector,
                                               load_detector_weights)
from pipeline.features.extract.runner import autocast
from pipeline.features.stores import Record, Schema, field

FEATURES_VERSION = 1  # bump when the same settings start giving other features
FPN_COCO_WEIGHTS = "fasterrcnn_resnet50_fpn_coco-258fb6c6.pth"
RESNET_ARCHS = ("c4", "c5")  # built on a plain ResNet: ImageNet weights can start them
BOTTOM_UP = "bottom-up"  # the VG bottom-up detector: its checkpoint says the rest


@dataclass
class RegionSettings:
    arch: str = "fpn"  # bottom-up (VG) | fpn (torchvision's fasterrcnn_resnet50_fpn) | c4 | c5
    backbone: str = "resnet50"
    weights: str | None = None  # a path, "random", or None for torchvision's cache
    weights_kind: str = "auto"  # detector | backbone | auto
    boxes: str = "detect"  # detect | given
    min_boxes: int = 10
    max_boxes: int = 100
    conf_thresh: float = 0.2
    nms_thresh: float = 0.3
    min_size: int = 600
    max_size: int = 1000
    num_classes: int = 91  # torchvision archs; bottom-up reads its counts from the checkpoint
    dtype: str = "float16"
    top_attributes: int = 1  # bottom-up: attributes kept per region, best first
    objects_vocab: str | None = None  # bottom-up: objects_vocab.txt (a name per class)
    attributes_vocab: str | None = None  # bottom-up: attributes_vocab.txt


def region_schema_for(extractor, s: RegionSettings) -> Schema:
    """The fields every region record of this extractor carries."""
    return region_schema(extractor.feature_dim, s.dtype, getattr(extractor, "top_attributes", 0))


def region_schema(feature_dim: int, dtype: str, top_attributes: int = 0) -> Schema:
    """Region records: features, boxes, scores, classes (and the ``top_attributes`` best
    attributes with their scores, when there are any)."""
    fields = [field("features", (feature_dim,), dtype),
              field("boxes", (4,), "float32"), field("scores", (), "float32"),
              field("classes", (), "int32")]
    if top_attributes:
        fields += [field("attributes", (top_attributes,), "int32"),
                   field("attribute_scores", (top_attributes,), "float32")]
    return Schema(tuple(fields))


def _resolve_weights(s: RegionSettings) -> tuple[str, str]:
    """(path or "random", md5) of the weights to load."""
    if s.arch == BOTTOM_UP:
        if not s.weights or s.weights == RANDOM:
            raise missing_checkpoint(Path(s.weights or "--weights"))
        path = Path(s.weights).expanduser().resolve()
        if not path.is_file():
            raise missing_checkpoint(path)
        return str(path), md5_of_file(path)
    if s.weights == RANDOM or (s.weights is None and s.arch in RESNET_ARCHS):
        w = resolve_weights(s.backbone, s.weights)  # c4/c5 without a file: ImageNet ResNet cache
        return w.path, w.md5
    if s.weights:
        path = Path(s.weights).expanduser().resolve()
        if not path.is_file():
            raise CapstackError(f"{s.weights}: detector weights not found")
        return str(path), md5_of_file(path)
    cached = Path(torch.hub.get_dir()) / "checkpoints" / FPN_COCO_WEIGHTS
    if not cached.is_file():
        raise CapstackError(f"no detector weights: put torchvision's COCO Faster R-CNN state_dict "
                            f"at {cached}, or pass --weights PATH (a detector, or a ResNet for "
                            f"--arch c4 or c5); --weights random gives meaningless random features")
    return str(cached), md5_of_file(cached)


def build_extractor(s: RegionSettings, weights_path: str, weights_md5: str | None = None):
    """The extractor ``s`` asks for, weights loaded (a BottomUpRegions or RegionFeatureExtractor)."""
    if s.arch == BOTTOM_UP:
        loaded = load_detector(weights_path, min_size=s.min_size, max_size=s.max_size,
                               md5=weights_md5)
        return BottomUpRegions(loaded.detector, min_boxes=s.min_boxes, max_boxes=s.max_boxes,
                               conf_thresh=s.conf_thresh, nms_thresh=s.nms_thresh,
                               top_attributes=s.top_attributes, loaded=loaded)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RANDOM_SEED)  # random parts are the same in every run (resume)
        detector = build_detector(s.arch, backbone=s.backbone, num_classes=s.num_classes,
                                  min_size=s.min_size, max_size=s.max_size)
    if weights_path != RANDOM:
        kind = "backbone" if s.weights is None and s.arch in RESNET_ARCHS else s.weights_kind
        load_detector_weights(detector, weights_path, kind=kind)
    return RegionFeatureExtractor(detector, min_boxes=s.min_boxes, max_boxes=s.max_boxes,
                                  conf_thresh=s.conf_thresh, nms_thresh=s.nms_thresh)


def given_boxes(dataset_json: Path) -> dict[int, np.ndarray]:
    """Each image's boxes from the json's ``boxes`` field ([x1, y1, x2, y2] or {"box": [...]})."""
    dataset = load_karpathy(dataset_json, images_inside_root=False)  # the boxes only
    return {im.image_id: _image_boxes(dataset_json, im) for im in dataset.images}


def _image_boxes(dataset_json: Path, im) -> np.ndarray:
    where = f"{dataset_json}: images[{im.index}] (imgid {im.imgid})"
    if "boxes" not in im.extra:
        raise CapstackError(f'{where}: no "boxes" field, which --boxes given needs')
    try:
        rows = [b["box"] if isinstance(b, dict) else b for b in im.extra["boxes"]]
        array = np.asarray(rows, dtype=np.float32).reshape(len(rows), -1)
    except (TypeError, KeyError, ValueError) as error:
        raise CapstackError(f"{where}.boxes: expected a list of [x1, y1, x2, y2] ({error})")
    if len(rows) == 0:
        return np.zeros((0, 4), np.float32)
    if array.shape[1] != 4 or not np.isfinite(array).all() or (array[:, 2:] <= array[:, :2]).any():
        raise CapstackError(f"{where}.boxes: expected finite [x1, y1, x2, y2] with x2 > x1 "
                            f"and y2 > y1")
    return array


def _boxes_digest(boxes: dict[int, np.ndarray]) -> str:
    h = hashlib.md5()
    for image_id in sorted(boxes):
        h.update(str(image_id).encode() + boxes[image_id].tobytes())
    return h.hexdigest()


def batch_model(extractor: RegionFeatureExtractor, device: torch.device,
                boxes: dict[int, np.ndarray] | None):
    def run(batch: dict) -> list[Record]:
        images = [img.to(device, non_blocking=True) for img in batch["images"]]
        wanted = None if boxes is None else [torch.from_numpy(boxes[i]).to(device)
                                              for i in batch["image_ids"]]
        with autocast(device):
            outs = extractor(images, wanted)
        return [Record(o["features"].float().cpu().numpy(), h, w,
                       boxes=o["boxes"].float().cpu().numpy(),
                       scores=o["scores"].float().cpu().numpy(),
                       classes=o["classes"].cpu().numpy().astype(np.int32),
                       **_attribute_fields(o))
                for o, h, w in zip(outs, batch["heights"], batch["widths"])]

    return run


def _attribute_fields(region: dict) -> dict:
    if "attributes" not in region:
        return {}
    return {"attributes": region["attributes"].cpu().numpy().astype(np.int32),
            "attribute_scores": region["attribute_scores"].float().cpu().numpy()}


def detector_settings(s: RegionSettings, probe) -> tuple[str, dict, dict]:
    """The store's backbone word, the fingerprinted settings and the metadata of the detector."""
    if s.arch != BOTTOM_UP:
        return s.backbone, {"weights_kind": s.weights_kind, "num_classes": s.num_classes}, {}
    loaded: LoadedDetector = probe.loaded
    config = loaded.detector.config
    depth = 2 + 3 * sum(config.resnet.blocks)
    objects, attributes = label_names(loaded, s.objects_vocab, s.attributes_vocab)
    settings = {"naming": loaded.naming, "detector": config.to_dict(),
                "top_attributes": probe.top_attributes}
    about = {**loaded.about(), "objects": objects, "attributes": attributes}
    return f"bottom-up-r{depth}", settings, about


def extract_regions(dataset_json: Path, image_root: Path, s: RegionSettings, *,
                    out: Path | None = None, root: Path | None = None, format: str | None = None,
                    pointer: Path | None = None, batch_size: int = 4, workers: int = 2,
                    device: str | None = None, progress: bool = True,
                    images_outside_root: bool = False) -> JobResult:
    if s.boxes not in ("detect", "given"):
        raise CapstackError(f"--boxes: expected detect or given, got {s.boxes!r}")
    if not 1 <= s.min_boxes <= s.max_boxes:
        raise CapstackError(f"--min-boxes/--max-boxes: need 1 <= min <= max (an image kept "
                            f"with no region has nothing to caption from), got "
                            f"{s.min_boxes}, {s.max_boxes}")
    weights_path, weights_md5 = _resolve_weights(s)
    boxes = given_boxes(dataset_json) if s.boxes == "given" else None
    dev = pick_device(device)
    probe = build_extractor(s, weights_path, weights_md5)  # fails early on bad weights
    backbone, detector, about = detector_settings(s, probe)
    settings = {"extractor": "extract-regions", "features_version": FEATURES_VERSION,
                "arch": s.arch, "weights_md5": weights_md5, "boxes": s.boxes,
                "min_size": s.min_size, "max_size": s.max_size,
                "feature_dim": probe.feature_dim, **detector}
    if boxes is None:
        settings |= {"min_boxes": s.min_boxes, "max_boxes": s.max_boxes,
                     "conf_thresh": s.conf_thresh, "nms_thresh": s.nms_thresh}
    else:
        settings["given_boxes_md5"] = _boxes_digest(boxes)
    job = ExtractionJob(
        kind="regions", backbone=backbone, dataset_json=Path(dataset_json),
        image_root=Path(image_root), dtype=s.dtype, out=out, root=root, format=format,
        images_outside_root=images_outside_root,
        schema=region_schema_for(probe, s),
        settings=settings, describe={"weights": weights_path, "layer": probe.layer,
                                     "resize": f"shorter side {s.min_size}, longer at most "
                                                   f"{s.max_size}", **about})

    def make_model():
        return batch_model(probe.to(dev), dev, boxes)

    return run_job(job, make_model, detector_transform(s.min_size, s.max_size),
                   batch_size=batch_size, workers=workers, pointer=pointer, progress=progress,
                   pin_memory=dev.type == "cuda")
