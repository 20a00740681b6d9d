"""What every region kind shares (``--arch`` of ``capstack extract-regions``).

Every region kind (``--arch``: the registered kinds that ``extract-regions``
runs) shares what this module holds: the box settings
(:class:`SharedRegionSettings`), the records (features, boxes, scores, classes,
and attributes when the kind has them) and the steps of :class:`RegionKind`.
Boxes are detected (``--boxes detect``: the bottom-up rule, 10-100 adaptive or
a fixed 36 with min = max) or taken from the dataset json (``--boxes given``:
each image's ``boxes`` field, e.g. the shapes' objects or another detector's
boxes), and described by the kind's detector: ``bottom-up``
(:mod:`~pipeline.features.extract.kinds.bottom_up`, the Visual Genome model) or
torchvision's Faster R-CNN ``fpn``, ``c4``, ``c5``
(:mod:`~pipeline.features.extract.kinds.regions`). Each kind adds its own settings
to the shared ones (its dataclass) and its own part of the fingerprinted
settings (:meth:`RegionKind.detector_settings`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.captions.karpathy import box_inside, image_box, image_boxes, load_karpathy
from pipeline.core.errors import CapstackError
from pipeline.features.detectors.selection import RegionExtractor
from pipeline.features.extract.job import Extraction
from pipeline.features.extract.kinds.base import ExtractorKind, half_precision, store_dtype
from pipeline.features.extract.runner import autocast
from pipeline.features.stores import Record, Schema, field
from pipeline.vision.images import detector_transform

FEATURES_VERSION = 1  # bump when the same settings start giving other features
COMMAND = "extract-regions"
BOXES = ("detect", "given")


@dataclass
class SharedRegionSettings:
    """The settings every region kind has (each kind's dataclass adds its own)."""

    weights: str | None = None  # the kind says what it loads (a path, "random", None)
    boxes: str = "detect"  # detect | given
    min_boxes: int = 10
    max_boxes: int = 100
    conf_thresh: float = 0.2
    nms_thresh: float = 0.3
    min_size: int = 600
    max_size: int = 1000
    dtype: str | None = None  # float16; float32 for random weights (store_dtype)


def region_schema_for(extractor, s: SharedRegionSettings) -> Schema:
    """The fields every region record of this extractor carries."""
    return region_schema(extractor.feature_dim, store_dtype(s.dtype, s.weights),
                         getattr(extractor, "top_attributes", 0))


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


def given_boxes(dataset_json: Path) -> dict[int, np.ndarray]:
    """Each image's boxes from the json's ``boxes`` field ([x1, y1, x2, y2] or {"box": [...]})."""
    dataset = load_karpathy(dataset_json, images_inside_root=False)  # the boxes only
    return {im.image_id: _image_boxes(dataset_json, im) for im in dataset.images}


def _image_boxes(dataset_json: Path, im) -> np.ndarray:
    where = f"{dataset_json}: images[{im.index}] (imgid {im.imgid})"
    if "boxes" not in im.extra:
        raise CapstackError(f'{where}: no "boxes" field, which --boxes given needs')
    rows = [image_box(dataset_json, im, k, b) for k, b in enumerate(image_boxes(dataset_json, im))]
    return np.asarray(rows, dtype=np.float32).reshape(len(rows), 4)


def _boxes_digest(boxes: dict[int, np.ndarray]) -> str:
    h = hashlib.md5()
    for image_id in sorted(boxes):
        h.update(str(image_id).encode() + boxes[image_id].tobytes())
    return h.hexdigest()


def batch_model(extractor: RegionExtractor, device: torch.device,
                boxes: dict[int, np.ndarray] | None, half: bool = True,
                dataset_json: Path | None = None):
    """Records for a collated batch: regions detected (or ``boxes`` given, read from
    ``dataset_json``: each refused when it lies wholly outside its image) and described on
    ``device``, in float16 on a GPU when ``half``."""

    def run(batch: dict) -> list[Record]:
        if boxes is not None:
            for image_id, h, w in zip(batch["image_ids"], batch["heights"], batch["widths"]):
                for k, box in enumerate(boxes[image_id]):
                    box_inside(f"{dataset_json}: image {image_id}: boxes[{k}]", box, w, h)
        images = [img.to(device, non_blocking=True) for img in batch["images"]]
        wanted = None if boxes is None else [torch.from_numpy(boxes[i]).to(device)
                                              for i in batch["image_ids"]]
        with autocast(device, half):
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


class RegionKind(ExtractorKind):
    """A kind extract-regions runs: detects (or takes) boxes and describes each by a vector.

    A kind says which weights file it loads (:meth:`weights_file`), builds its
    :class:`RegionExtractor` (:meth:`build`) and names its own part of the store's
    settings (:meth:`detector_settings`); the rest is the same for every kind.
    """

    command = COMMAND

    def weights_file(self, s) -> tuple[str, str]:
        """(path or "random", md5) of the weights ``s`` asks for; refused with where to put them."""
        raise NotImplementedError

    def build(self, s, weights_path: str, weights_md5: str | None = None) -> RegionExtractor:
        """The extractor ``s`` asks for, weights loaded."""
        raise NotImplementedError

    def detector_settings(self, s, probe: RegionExtractor) -> tuple[str, dict, dict]:
        """The store's backbone word, the kind's fingerprinted settings and its metadata."""
        raise NotImplementedError

    def made(self, producer: dict) -> bool:
        return producer.get("name") == self.command and \
            producer.get("settings", {}).get("arch") == self.name

    def prepare(self, s, dataset_json: Path, device: torch.device) -> Extraction:
        if s.boxes not in BOXES:
            raise CapstackError(f"--boxes: expected {' or '.join(BOXES)}, got {s.boxes!r}")
        if not 1 <= s.min_boxes <= s.max_boxes:
            raise CapstackError(f"--min-boxes/--max-boxes: need 1 <= min <= max (an image kept "
                                f"with no region has nothing to caption from), got "
                                f"{s.min_boxes}, {s.max_boxes}")
        weights_path, weights_md5 = self.weights_file(s)
        boxes = given_boxes(dataset_json) if s.boxes == "given" else None
        probe = self.build(s, weights_path, weights_md5)  # fails early on bad weights
        backbone, detector, about = self.detector_settings(s, probe)
        settings = {"extractor": self.command, "features_version": FEATURES_VERSION,
                    "arch": self.name, "weights_md5": weights_md5, "boxes": s.boxes,
                    "min_size": s.min_size, "max_size": s.max_size,
                    "feature_dim": probe.feature_dim, **detector}
        if boxes is None:
            settings |= {"min_boxes": s.min_boxes, "max_boxes": s.max_boxes,
                         "conf_thresh": s.conf_thresh, "nms_thresh": s.nms_thresh}
        else:
            settings["given_boxes_md5"] = _boxes_digest(boxes)
        return Extraction(
            kind="regions", backbone=backbone, dtype=store_dtype(s.dtype, s.weights),
            schema=region_schema_for(probe, s), settings=settings,
            describe={"weights": weights_path, "layer": probe.layer,
                      "resize": f"shorter side {s.min_size}, longer at most {s.max_size}",
                      **about},
            make_model=lambda: batch_model(probe.to(device), device, boxes,
                                           half_precision(s.weights), dataset_json),
            transform=detector_transform(s.min_size, s.max_size),
            pin_memory=device.type == "cuda")

    def rebuild(self, s, weights_md5: str, where: str, device: torch.device):
        if s.boxes == "given":
            raise CapstackError(f"{where}: its regions are the dataset's own boxes (--boxes "
                                f"given), and new images have none: caption with a checkpoint "
                                f"trained on grid features or detected regions")
        extractor = self.build(s, s.weights, weights_md5).eval().to(device)
        return (batch_model(extractor, device, None, half_precision(s.weights)),
                detector_transform(s.min_size, s.max_size))
