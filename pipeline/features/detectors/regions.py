"""Regions of a bottom-up detector, kept and labelled by its reference's rules.

Detect mode: the regions the detector's rules keep (:mod:`.rules`; by default
the proposals ranked and kept by ``generate_tsv.py``'s rule). Given boxes:
exactly those, described. Per region the record holds the feature, the box
(original image pixels), ``scores`` (the confidence the rule ranked it by),
``classes`` (the most likely object class, 1..K-1; 0 is the background), and
the ``top_attributes`` most likely attributes with their probabilities (1..A-1;
0, "no attribute", is never reported), best first.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pipeline.features.detectors.checkpoints import LoadedDetector
from pipeline.features.detectors.detector import BottomUpDetector, Detections
from pipeline.features.detectors.rules.base import Selection
from pipeline.features.detectors.rules.caffe import top_attributes
from pipeline.features.detectors.selection import RegionExtractor


class BottomUpRegions(RegionExtractor):
    detector: BottomUpDetector

    def __init__(self, detector: BottomUpDetector, *, min_boxes: int = 10, max_boxes: int = 100,
                 conf_thresh: float = 0.2, nms_thresh: float = 0.3, top_attributes: int = 1,
                 loaded: LoadedDetector | None = None):
        super().__init__(detector, min_boxes=min_boxes, max_boxes=max_boxes,
                         conf_thresh=conf_thresh, nms_thresh=nms_thresh)
        self.loaded = loaded  # the checkpoint it came from, for the store's metadata
        has_attributes = detector.attributes is not None
        self.top_attributes = min(top_attributes, detector.config.num_attributes - 1) \
            if has_attributes else 0
        self.feature_dim = detector.feature_dim
        shape = detector.config.resnet
        self.layer = (f"ROIPool {detector.config.pool_size}x{detector.config.pool_size} on res4 "
                      f"(stride 16), res5 (stride {shape.res5_stride}, dilation "
                      f"{shape.res5_dilation}), spatial mean ({self.feature_dim}-d)")

    @property
    def selection(self) -> Selection:
        return Selection(self.min_boxes, self.max_boxes, self.conf_thresh, self.nms_thresh,
                         self.top_attributes)

    def given(self, found: Detections) -> dict[str, Tensor]:
        """The boxes given, each labelled with its best foreground class."""
        keep = torch.arange(len(found.boxes), device=found.boxes.device)
        foreground = found.class_probs[:, 1:]
        region = {"keep": keep, "boxes": found.boxes,
                  "scores": foreground.max(dim=1).values if len(keep) else foreground.new_zeros(0),
                  "classes": foreground.argmax(dim=1) + 1 if len(keep) else keep.new_zeros(0)}
        if self.top_attributes:
            assert found.attribute_probs is not None, "top_attributes is 0 without the head"
            region |= top_attributes(found.attribute_probs, self.top_attributes)
        return region

    @torch.inference_mode()
    def forward(self, images: list[Tensor], boxes: list[Tensor] | None = None) -> list[dict]:
        """Per image: ``features`` [N, D], ``boxes`` [N, 4], ``scores`` [N], ``classes`` [N],
        and with an attribute head ``attributes`` / ``attribute_scores`` [N, top_attributes]."""
        out = []
        for found in self.detector(images, boxes):
            region = (self.given(found) if boxes is not None
                      else self.detector.rules.regions(found, self.selection))
            region["features"] = found.features[region.pop("keep")]
            out.append(region)
        return out
