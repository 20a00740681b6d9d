"""Regions of a bottom-up detector as ``generate_tsv.py`` keeps them, labelled.

Detect mode: the proposals, ranked and kept by the bottom-up rule
(:func:`select_regions`, with Caffe's inclusive-pixel NMS). Given boxes: exactly
those, described. Per region the record holds the feature, the box (original
image pixels), ``scores`` (the confidence the rule ranked it by), ``classes`` (the
most likely object class, 1..K-1; 0 is the background), and the ``top_attributes``
most likely attributes with their probabilities (1..A-1; 0, "no attribute", is
never reported), best first.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pipeline.features.detectors.boxes import inclusive
from pipeline.features.detectors.checkpoints import LoadedDetector
from pipeline.features.detectors.detector import BottomUpDetector
from pipeline.features.detectors.selection import RegionExtractor


class BottomUpRegions(RegionExtractor):
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

    @torch.inference_mode()
    def forward(self, images: list[Tensor], boxes: list[Tensor] | None = None) -> list[dict]:
        """Per image: ``features`` [N, D], ``boxes`` [N, 4], ``scores`` [N], ``classes`` [N],
        and with an attribute head ``attributes`` / ``attribute_scores`` [N, top_attributes]."""
        out = []
        for k, found in enumerate(self.detector(images, boxes)):
            foreground = found.class_probs[:, 1:]  # [P, K-1]
            if boxes is None:
                keep, scores = self.select(inclusive(found.boxes), foreground)
            else:
                keep = torch.arange(len(found.boxes), device=found.boxes.device)
                scores = foreground.max(dim=1).values if len(keep) else foreground.new_zeros(0)
            region = {"features": found.features[keep], "boxes": found.boxes[keep],
                      "scores": scores.float(),
                      "classes": foreground[keep].argmax(dim=1) + 1 if len(keep)
                      else keep.new_zeros(0)}
            if self.top_attributes:
                probs = found.attribute_probs[keep][:, 1:]  # [N, A-1]
                top = probs.topk(self.top_attributes, dim=1)
                region |= {"attributes": top.indices + 1, "attribute_scores": top.values}
            out.append(region)
        return out
