"""``mmf``: the rules of facebookresearch/mmf's ``tools/scripts/features/frcnn``.

That extractor (HuggingFace's LXMERT demo code, after detectron2 and
airsplay/py-bottom-up-attention) runs the same VG network as generate_tsv.py
with detectron2's conventions around it:

- input (``Preprocess``, ``ResizeShortestEdge``): the decoded 0..255 RGB values
  resized with ``F.interpolate`` (bilinear, sampling at input/output size) to
  sides ``int(x + 0.5)`` of the shorter side at ``min_size`` (the longer capped at
  ``max_size``), then BGR, minus the pixel means; each side has its own scale,
  and boxes go back to the image by each;
- anchors (``AnchorGenerator``, offset 0): sizes ``stride * scales`` at each ratio
  of the size's area, unrounded, centred on the cell's corner; when the
  checkpoint carries its anchors (``cell_anchors.0``), those, as MMF loads them;
- proposals (``find_top_rpn_proposals``): the ``pre_nms`` best logits first, then
  boxes decoded the detectron2 way (widths ``x2 - x1``), clipped to [0, W] x
  [0, H], those with a side at most ``MIN_SIDE`` dropped, NMS, ``post_nms`` kept;
- regions (``ROIOutputs.inference``, ``do_nms``): each proposal's best
  foreground class and its probability; the proposal's box regressed for that
  class and clipped; one class-agnostic NMS over those boxes at ``nms_thresh``;
  the ``max_boxes`` best kept. The features are the proposals' (pooled before
  regression). A region's attribute probabilities are the softmax over the real
  attributes only ("no attribute" left out).

Two points where capstack does not crash where MMF does: an image whose NMS keeps
fewer than ``min_boxes`` makes ``do_nms`` return None (MMF then fails, or reuses
the previous image's boxes); capstack keeps what survived. ``conf_thresh`` is
unused, as in ``do_nms``. MMF pads a batch of images to one size before the
trunk, which changes the features of all but the largest; capstack runs each
size apart, as MMF does at its default batch of one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import nms

from pipeline.features.detectors import boxes as caffe_boxes
from pipeline.features.detectors.rpn import per_anchor
from pipeline.features.detectors.rules import RULES
from pipeline.features.detectors.rules.base import DetectorRules, Selection

MIN_SIDE = 0.0  # detectron2's PROPOSAL_GENERATOR.MIN_SIZE, in the resized image's pixels


def resized_sides(height: int, width: int, min_size: int, max_size: int) -> tuple[int, int]:
    """``ResizeShortestEdge``'s output (h, w): the shorter side at min_size, the longer
    at most max_size, each rounded half up."""
    scale = min_size / min(height, width)
    h, w = (min_size, scale * width) if height < width else (scale * height, min_size)
    if max(h, w) > max_size:
        shrink = max_size / max(h, w)
        h, w = h * shrink, w * shrink
    return int(h + 0.5), int(w + 0.5)


def mmf_input(image: Tensor, min_size: int, max_size: int,
              means_bgr: tuple[float, float, float]) -> tuple[Tensor, Tensor]:
    """RGB floats 0..1 [3, H, W] -> BGR 0..255 minus the means, resized; and the per-side
    factors (y, x) back to the original image (float32, as MMF's ``scales_yx``)."""
    height, width = image.shape[-2:]
    size = resized_sides(height, width, min_size, max_size)
    values = (image * 255.0).round()  # the decoded 8-bit values MMF starts from
    resized = F.interpolate(values[None], size, mode="bilinear", align_corners=False)[0]
    bgr = resized.flip(0) - image.new_tensor(means_bgr).view(3, 1, 1)
    back = torch.tensor([height, width]) / torch.tensor(size)  # int / int -> float32
    return bgr, back.to(image.device)


def mmf_cell_anchors(stride: int, ratios, scales) -> Tensor:
    """detectron2's ``generate_cell_anchors`` for sizes ``stride * scales``, [A, 4] float32,
    listed ratio-major (the RPN's channel order once a checkpoint is converted)."""
    rows = []
    for ratio in ratios:
        for scale in scales:
            w = math.sqrt((stride * scale) ** 2.0 / ratio)
            h = ratio * w
            rows.append([-w / 2.0, -h / 2.0, w / 2.0, h / 2.0])
    return torch.tensor(rows, dtype=torch.float32)


def decode(deltas: Tensor, boxes: Tensor) -> Tensor:
    """detectron2's ``Box2BoxTransform.apply_deltas`` (weights 1), [N, 4]: widths x2 - x1."""
    return caffe_boxes.decode(deltas, boxes.to(deltas.dtype), inclusive_pixels=False)


def clip(boxes: Tensor, height: int, width: int) -> Tensor:
    """Boxes inside [0, W] x [0, H] (``_clip_box``: the far edge is W, not W - 1)."""
    x = boxes[:, 0::2].clamp(0, width)
    y = boxes[:, 1::2].clamp(0, height)
    return torch.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], dim=1)


def per_side(scale: Tensor) -> Tensor:
    """(y, x) factors -> the factor of each box coordinate (x1, y1, x2, y2)."""
    return scale[[1, 0, 1, 0]]


class MmfRules(DetectorRules):
    """facebookresearch/mmf's frcnn extractor (LXMERT's): regressed boxes, one NMS"""

    name = "mmf"

    def network_input(self, image: Tensor, config) -> tuple[Tensor, Tensor]:
        return mmf_input(image, config.min_size, config.max_size, config.pixel_means_bgr)

    def cell_anchors(self, proposals, file_anchors: Tensor | None) -> Tensor:
        if file_anchors is not None:
            return file_anchors.float()
        return mmf_cell_anchors(proposals.stride, proposals.ratios, proposals.scales)

    def proposals(self, generator, objectness: Tensor, deltas: Tensor,
                  image_size: tuple[int, int], scale: Tensor) -> Tensor:
        s = generator.settings
        logits, deltas = per_anchor(objectness, deltas)
        logits, order = logits.float().sort(descending=True)
        order, logits = order[:s.pre_nms], logits[:s.pre_nms]
        anchors = generator.anchors(*objectness.shape[-2:])
        boxes = clip(decode(deltas[order].float(), anchors[order]), *image_size)
        widths, heights = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        big_enough = (widths > MIN_SIDE) & (heights > MIN_SIDE)
        boxes, logits = boxes[big_enough], logits[big_enough]
        return boxes[nms(boxes, logits, s.nms)[:s.post_nms]]

    def to_input(self, boxes: Tensor, scale: Tensor) -> Tensor:
        return boxes / per_side(scale).to(boxes.dtype)

    def to_original(self, boxes: Tensor, scale: Tensor) -> Tensor:
        return boxes * per_side(scale).to(boxes.dtype)

    def regions(self, found, selection: Selection) -> dict[str, Tensor]:
        scores, best = found.class_probs[:, 1:].max(dim=1)  # foreground: [P], [P] 0-based
        rows = torch.arange(len(best), device=best.device)
        deltas = found.box_deltas.reshape(len(best), -1, 4)[rows, best + 1]
        boxes = clip(decode(deltas.float(), found.proposals), *found.input_size)
        keep = nms(boxes, scores, selection.nms_thresh)[:selection.max_boxes]
        region = {"keep": keep, "boxes": self.to_original(boxes[keep], found.scale),
                  "scores": scores[keep].float(), "classes": best[keep] + 1}
        if selection.top_attributes:
            real = found.attribute_probs[keep][:, 1:]  # softmax over the real attributes only
            top = (real / real.sum(dim=1, keepdim=True)).topk(selection.top_attributes, dim=1)
            region |= {"attributes": top.indices + 1, "attribute_scores": top.values}
        return region


RULES.register("mmf")(MmfRules())
