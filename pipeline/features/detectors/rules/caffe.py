"""``caffe``: the rules of Anderson et al.'s ``generate_tsv.py`` (py-faster-rcnn), the default.

Input (``fast_rcnn/test.py: _get_image_blob``): the image in BGR order, 0..255,
minus the Caffe pixel means, no division by a std; scaled so that the shorter
side is ``min_size`` unless the longer one would exceed ``max_size`` (then the
longer side is ``max_size``); resized bilinearly as ``cv2.resize(fx=scale,
fy=scale)`` does (output side rounded, sampling at 1/scale). One scale for
both sides.

Anchors: ``generate_anchors`` (:mod:`..anchors`), centred at 7.5, rounded sizes.
Proposals: ``proposal_layer.py`` (:class:`..rpn.ProposalGenerator`). Regions: the
proposals themselves (not the regressed boxes), kept by the per-class NMS rule
(:func:`..selection.select_regions`, Caffe's inclusive-pixel areas); a region's
attribute probabilities are the softmax over all attributes, "no attribute" included.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pipeline.features.detectors.anchors import cell_anchors
from pipeline.features.detectors.boxes import inclusive
from pipeline.features.detectors.rules import RULES
from pipeline.features.detectors.rules.base import DetectorRules, Selection
from pipeline.features.detectors.selection import select_regions


def scale_for(height: int, width: int, min_size: int, max_size: int) -> float:
    """The Caffe test scale: shorter side to min_size, unless the longer passes max_size."""
    short, long = min(height, width), max(height, width)
    scale = min_size / short
    if round(scale * long) > max_size:
        scale = max_size / long
    return scale


def caffe_input(image: Tensor, scale: float, means_bgr: tuple[float, float, float]) -> Tensor:
    """RGB floats 0..1 [3, H, W] -> the network's input: BGR, 0..255 minus the means, resized."""
    bgr = image.flip(0) * 255.0 - image.new_tensor(means_bgr).view(3, 1, 1)
    h, w = image.shape[-2:]
    size = [max(1, round(h * scale)), max(1, round(w * scale))]  # cv2: dsize rounded
    # cv2.resize(fx=scale) samples at 1/scale, not at size/original: pass both, as cv2 does
    return torch.ops.aten.upsample_bilinear2d(bgr[None], size, False, scale, scale)[0]


def top_attributes(probs: Tensor, k: int) -> dict[str, Tensor]:
    """The ``k`` most likely attributes (1..A-1) of each region and their probabilities."""
    top = probs[:, 1:].topk(k, dim=1)
    return {"attributes": top.indices + 1, "attribute_scores": top.values}


class CaffeRules(DetectorRules):
    """Anderson et al.'s generate_tsv.py (py-faster-rcnn): the BUTD release's features"""

    name = "caffe"

    def network_input(self, image: Tensor, config) -> tuple[Tensor, float]:
        height, width = image.shape[-2:]
        scale = scale_for(height, width, config.min_size, config.max_size)
        return caffe_input(image, scale, config.pixel_means_bgr), scale

    def cell_anchors(self, proposals, file_anchors: Tensor | None) -> Tensor:
        return cell_anchors(proposals.stride, proposals.ratios, proposals.scales)

    def proposals(self, generator, objectness: Tensor, deltas: Tensor,
                  image_size: tuple[int, int], scale: float) -> Tensor:
        return generator(objectness, deltas, image_size, scale)[0]

    def to_input(self, boxes: Tensor, scale: float) -> Tensor:
        return boxes * scale

    def to_original(self, boxes: Tensor, scale: float) -> Tensor:
        return boxes / scale

    def regions(self, found, selection: Selection) -> dict[str, Tensor]:
        foreground = found.class_probs[:, 1:]  # [P, K-1]
        keep, scores = select_regions(
            inclusive(found.boxes), foreground, nms_thresh=selection.nms_thresh,
            conf_thresh=selection.conf_thresh, min_boxes=selection.min_boxes,
            max_boxes=selection.max_boxes)
        region = {"keep": keep, "boxes": found.boxes[keep], "scores": scores.float(),
                  "classes": foreground[keep].argmax(dim=1) + 1 if len(keep)
                  else keep.new_zeros(0)}
        if selection.top_attributes:
            region |= top_attributes(found.attribute_probs[keep], selection.top_attributes)
        return region


RULES.register("caffe")(CaffeRules())
