"""The region proposal network of the bottom-up model, at test time as py-faster-rcnn runs it.

A 3x3 convolution (ReLU) on res4, then per anchor one objectness logit and four
box deltas. The Caffe model scores an anchor with a softmax over two channels
(background, foreground); softmax([b, f])[1] = sigmoid(f - b), so a checkpoint's
two channels are converted into one logit (:mod:`checkpoints`) and the
probabilities are the same. Proposals (``proposal_layer.py``, TEST settings):
decode every anchor, clip to the image, drop boxes under ``min_size`` pixels of
the original image, keep the ``pre_nms`` best, NMS at ``nms``, keep ``post_nms``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.features.detectors import boxes as caffe_boxes
from pipeline.features.detectors.anchors import VG_RATIOS, VG_SCALES, cell_anchors, grid_anchors


@dataclass(frozen=True)
class ProposalSettings:
    """py-faster-rcnn's TEST.RPN_* values, the ones the VG features were made with."""

    pre_nms: int = 6000
    post_nms: int = 300
    nms: float = 0.7
    min_size: int = 16  # pixels of the original image (scaled with it)
    ratios: tuple[float, ...] = VG_RATIOS
    scales: tuple[float, ...] = VG_SCALES
    stride: int = 16


class RPNHead(nn.Module):
    """conv 3x3 + ReLU, then objectness [B, A, h, w] and deltas [B, 4A, h, w]."""

    def __init__(self, in_channels: int, channels: int, anchors: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.objectness = nn.Conv2d(channels, anchors, 1)
        self.deltas = nn.Conv2d(channels, 4 * anchors, 1)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        x = F.relu(self.conv(x))
        return self.objectness(x), self.deltas(x)


def per_anchor(objectness: Tensor, deltas: Tensor) -> tuple[Tensor, Tensor]:
    """One image's maps -> rows in anchor order (cell-major, then anchor): [N], [N, 4]."""
    a, h, w = objectness.shape
    logits = objectness.permute(1, 2, 0).reshape(-1)  # [h*w*A]
    deltas = deltas.reshape(a, 4, h, w).permute(2, 3, 0, 1).reshape(-1, 4)  # [h*w*A, 4]
    return logits, deltas


class ProposalGenerator(nn.Module):
    """Proposals per image from the RPN head's outputs."""

    cell: Tensor  # a buffer: the anchors of the cell at the origin, [A, 4]

    def __init__(self, settings: ProposalSettings = ProposalSettings()):
        super().__init__()
        self.settings = settings
        self.register_buffer("cell", cell_anchors(settings.stride, settings.ratios,
                                                  settings.scales), persistent=False)

    def use_cell(self, cell: Tensor) -> None:
        """Other anchors for the cell at the origin (a reference's rules), [A, 4]."""
        if cell.shape != self.cell.shape:
            raise ValueError(f"the RPN scores {self.cell.shape[0]} anchors per cell, "
                             f"not {cell.shape[0]}")
        self.cell = cell

    @property
    def anchors_per_cell(self) -> int:
        return self.cell.shape[0]

    def anchors(self, height: int, width: int) -> Tensor:
        """All anchors over a res4 map of ``height`` x ``width`` cells, [h*w*A, 4]."""
        return grid_anchors(self.cell.cpu(), height, width, self.settings.stride).to(
            self.cell.device)

    def forward(self, objectness: Tensor, deltas: Tensor, image_size: tuple[int, int],
                scale: float, settings: ProposalSettings | None = None) -> tuple[Tensor, Tensor]:
        """One image: proposals [P, 4] in the resized image's pixels and their logits [P].

        objectness [A, h, w], deltas [4A, h, w]; image_size (H, W) resized; scale = resized /
        original (the minimum size is in original pixels). ``settings`` replaces the test
        settings' counts and thresholds (training keeps more proposals); the anchors stay.
        """
        s = settings or self.settings
        logits, deltas = per_anchor(objectness, deltas)
        anchors = self.anchors(*objectness.shape[-2:])
        boxes = caffe_boxes.clip(caffe_boxes.decode(deltas.float(), anchors), *image_size)
        w, h = caffe_boxes.widths_heights(boxes)
        big_enough = (w >= s.min_size * scale) & (h >= s.min_size * scale)
        boxes, logits = boxes[big_enough], logits[big_enough].float()
        order = logits.argsort(descending=True)[:s.pre_nms]
        boxes, logits = boxes[order], logits[order]
        keep = caffe_boxes.caffe_nms(boxes, logits, s.nms)[:s.post_nms]
        return boxes[keep], logits[keep]
