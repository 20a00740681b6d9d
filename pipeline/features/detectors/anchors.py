"""The RPN's anchors as the Caffe model made them (py-faster-rcnn's ``generate_anchors``).

A base box of ``stride`` x ``stride`` pixels, (0, 0, 15, 15) for stride 16, is
reshaped to each aspect ratio keeping its area (widths rounded to whole pixels),
then scaled; the list is ratio-major (all scales of the first ratio first). The
anchors of a feature map cell (y, x) are these shifted by (x, y) * stride, and
they are laid out cell-major: anchor ``a`` of cell (y, x) is row
``(y * W + x) * A + a``, the order in which the RPN's channels are read.

Boxes use the Caffe pixel convention: (x1, y1, x2, y2) inclusive, a box of width
w has x2 = x1 + w - 1. Centres fall on (stride - 1) / 2 = 7.5 within a cell, not on 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

VG_RATIOS = (0.5, 1.0, 2.0)
VG_SCALES = (4, 8, 16, 32)  # x 16 px: anchors of 64 to 512 pixels


def _boxes_around(widths: Tensor, heights: Tensor, cx: float, cy: float) -> Tensor:
    return torch.stack([cx - 0.5 * (widths - 1), cy - 0.5 * (heights - 1),
                        cx + 0.5 * (widths - 1), cy + 0.5 * (heights - 1)], dim=1)


def cell_anchors(stride: int = 16, ratios=VG_RATIOS, scales=VG_SCALES) -> Tensor:
    """The A = len(ratios) * len(scales) anchors of the cell at the origin, [A, 4] float64."""
    size = float(stride * stride)
    centre = (stride - 1) / 2.0
    ratios = torch.tensor(ratios, dtype=torch.float64)
    scales = torch.tensor(scales, dtype=torch.float64)
    widths = torch.round(torch.sqrt(size / ratios))  # the base box at each ratio, area kept
    heights = torch.round(widths * ratios)
    anchors = []
    for w, h in zip(widths, heights):  # ratio-major, then scales
        anchors.append(_boxes_around(w * scales, h * scales, centre, centre))
    return torch.cat(anchors)


def grid_anchors(cell: Tensor, height: int, width: int, stride: int) -> Tensor:
    """Every cell's anchors over a ``height`` x ``width`` map, [height * width * A, 4] float32."""
    ys = torch.arange(height, dtype=torch.float64) * stride
    xs = torch.arange(width, dtype=torch.float64) * stride
    y, x = torch.meshgrid(ys, xs, indexing="ij")
    shifts = torch.stack([x, y, x, y], dim=-1).reshape(-1, 1, 4)  # [H*W, 1, 4]
    return (shifts + cell.reshape(1, -1, 4)).reshape(-1, 4).float()
