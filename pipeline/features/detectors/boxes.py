"""Boxes as the Caffe model computes them: inclusive pixel coordinates (the legacy "+1").

In py-faster-rcnn a box (x1, y1, x2, y2) covers pixels x1..x2, so its width is
x2 - x1 + 1; that enters the box coding, the clipping to [0, W - 1], the minimum
proposal size and the areas that NMS compares. A network trained on that
convention decodes its deltas the same way, so the VG model's proposals (and the
regions it keeps) move by a pixel or more without it.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.ops import batched_nms, nms

# log(1000 / 16), detectron2's cap; py-faster-rcnn has none. Only a delta that widens a box
# over 62 times meets it (such a box is then mostly clipped to the image anyway), and it
# keeps exp() finite: no inf, no nan after clipping.
BBOX_CLIP = 4.135166556742356


def widths_heights(boxes: Tensor) -> tuple[Tensor, Tensor]:
    return boxes[:, 2] - boxes[:, 0] + 1.0, boxes[:, 3] - boxes[:, 1] + 1.0


def decode(deltas: Tensor, boxes: Tensor, *, inclusive_pixels: bool = True) -> Tensor:
    """Apply (dx, dy, dw, dh) to boxes: py-faster-rcnn's ``bbox_transform_inv``, [N, 4].

    As there, x2 = centre + w / 2 (not - 1): the decoded box is one pixel wider than
    the encoded one would be; the VG model was trained and tested with exactly this.
    ``inclusive_pixels=False``: detectron2's ``apply_deltas`` (weights 1), widths x2 - x1.
    """
    w, h = widths_heights(boxes) if inclusive_pixels else \
        (boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1])
    cx, cy = boxes[:, 0] + 0.5 * w, boxes[:, 1] + 0.5 * h
    dx, dy, dw, dh = deltas.unbind(dim=1)
    dw, dh = dw.clamp(max=BBOX_CLIP), dh.clamp(max=BBOX_CLIP)
    px, py = dx * w + cx, dy * h + cy
    pw, ph = torch.exp(dw) * w, torch.exp(dh) * h
    return torch.stack([px - 0.5 * pw, py - 0.5 * ph, px + 0.5 * pw, py + 0.5 * ph], dim=1)


def encode(targets: Tensor, boxes: Tensor) -> Tensor:
    """The deltas that take ``boxes`` to ``targets`` (``bbox_transform``), [N, 4]."""
    w, h = widths_heights(boxes)
    cx, cy = boxes[:, 0] + 0.5 * w, boxes[:, 1] + 0.5 * h
    tw, th = widths_heights(targets)
    tx, ty = targets[:, 0] + 0.5 * tw, targets[:, 1] + 0.5 * th
    return torch.stack([(tx - cx) / w, (ty - cy) / h, torch.log(tw / w), torch.log(th / h)], dim=1)


def clip(boxes: Tensor, height: int, width: int) -> Tensor:
    """Boxes inside the image's pixels 0..W-1, 0..H-1 (``clip_boxes``)."""
    x = boxes[:, 0::2].clamp(0, width - 1)
    y = boxes[:, 1::2].clamp(0, height - 1)
    return torch.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], dim=1)


def inclusive(boxes: Tensor) -> Tensor:
    """Boxes grown by one pixel right and down: torchvision's areas and overlaps (x2 - x1)
    then equal Caffe's (x2 - x1 + 1), so its NMS and box_iou compute Caffe's."""
    return boxes + boxes.new_tensor([0.0, 0.0, 1.0, 1.0])


def caffe_nms(boxes: Tensor, scores: Tensor, threshold: float) -> Tensor:
    """Indices kept by NMS with Caffe's inclusive areas, best first."""
    return nms(inclusive(boxes), scores, threshold)


def caffe_batched_nms(boxes: Tensor, scores: Tensor, groups: Tensor, threshold: float) -> Tensor:
    """Per-group (per-class) NMS with Caffe's inclusive areas."""
    return batched_nms(inclusive(boxes), scores, groups, threshold)
