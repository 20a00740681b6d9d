"""The ResNet of the Caffe bottom-up model (MSRA's original ResNet), up to res4 and its res5.

It differs from torchvision's ResNet in three ways, each of which changes the
features a checkpoint gives, so each is a setting here:

- ``stride_in_1x1``: a downsampling bottleneck strides in its first 1x1
  convolution (MSRA's Caffe ResNet), not in the 3x3 (torchvision's "v1.5").
- ``caffe_maxpool``: the stem's 3x3/2 max-pool has no padding and rounds its
  output size up (Caffe's pooling layer), where torchvision pads by 1 and rounds
  down: the grids are shifted by half a cell against each other.
- ``res5_stride``, ``res5_dilation``: the VG model runs res5 on each 14x14 RoI at
  stride 1 with its 3x3 convolutions dilated by 2 (test.prototxt: res5a_branch1 and
  res5a_branch2a stride 1, res5a_branch2b dilation 2, pad 2), where detectron2's C4
  default halves the RoI to 7x7 (stride 2, no dilation).
- batch norm is frozen into a per-channel affine (``torchvision.ops.FrozenBatchNorm2d``,
  y = (x - mean) / sqrt(var + eps) * weight + bias). A network trained here uses
  real batch norm (``frozen_norm=False``) and saves the same four tensors.

Convolutions have no bias. Every convolution carries its norm (:class:`ConvNorm`),
so a block's state_dict reads ``conv1.weight``, ``conv1.norm.weight`` ...
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import FrozenBatchNorm2d


@dataclass(frozen=True)
class ResNetShape:
    """Blocks per stage (res2..res5) and the stem's width; R101: (3, 4, 23, 3), 64."""

    blocks: tuple[int, int, int, int] = (3, 4, 23, 3)
    width: int = 64  # stem output; stage k's bottleneck width is width * 2**(k-2), output 4x that
    stride_in_1x1: bool = True
    caffe_maxpool: bool = True
    res5_stride: int = 1  # VG model: res5 keeps the 14x14 RoI grid (stride 1) ...
    res5_dilation: int = 2  # ... and dilates its 3x3 convolutions by 2 instead

    def channels(self, stage: int) -> int:
        """Output channels of res``stage`` (2..5): 256, 512, 1024, 2048 for width 64."""
        return self.width * 4 * 2 ** (stage - 2)


class ConvNorm(nn.Conv2d):
    """A bias-free convolution followed by its (frozen or training) batch norm."""

    def __init__(self, cin: int, cout: int, kernel: int, *, stride: int = 1, dilation: int = 1,
                 frozen_norm: bool = True):
        padding = dilation * (kernel - 1) // 2
        super().__init__(cin, cout, kernel, stride=stride, padding=padding, dilation=dilation,
                         bias=False)
        self.norm = FrozenBatchNorm2d(cout) if frozen_norm else nn.BatchNorm2d(cout)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(super().forward(x))


class Bottleneck(nn.Module):
    """1x1 -> 3x3 -> 1x1 with a projection shortcut when the shape changes."""

    def __init__(self, cin: int, width: int, cout: int, *, stride: int, dilation: int,
                 stride_in_1x1: bool, frozen_norm: bool):
        super().__init__()
        stride_1x1, stride_3x3 = (stride, 1) if stride_in_1x1 else (1, stride)
        self.shortcut = (ConvNorm(cin, cout, 1, stride=stride, frozen_norm=frozen_norm)
                         if cin != cout or stride != 1 else None)
        self.conv1 = ConvNorm(cin, width, 1, stride=stride_1x1, frozen_norm=frozen_norm)
        self.conv2 = ConvNorm(width, width, 3, stride=stride_3x3, dilation=dilation,
                              frozen_norm=frozen_norm)
        self.conv3 = ConvNorm(width, cout, 1, frozen_norm=frozen_norm)

    def forward(self, x: Tensor) -> Tensor:
        y = F.relu_(self.conv1(x))
        y = F.relu_(self.conv2(y))
        y = self.conv3(y)
        return F.relu_(y + (x if self.shortcut is None else self.shortcut(x)))


class Stem(nn.Module):
    """conv 7x7/2 (pad 3), norm, ReLU, max-pool 3x3/2: the input at stride 4."""

    def __init__(self, width: int, *, caffe_maxpool: bool, frozen_norm: bool):
        super().__init__()
        self.conv1 = ConvNorm(3, width, 7, stride=2, frozen_norm=frozen_norm)
        self.caffe_maxpool = caffe_maxpool

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu_(self.conv1(x))
        if self.caffe_maxpool:  # Caffe: no padding, output size rounded up
            return F.max_pool2d(x, kernel_size=3, stride=2, padding=0, ceil_mode=True)
        return F.max_pool2d(x, kernel_size=3, stride=2, padding=1)  # torchvision


def stage(shape: ResNetShape, index: int, *, frozen_norm: bool) -> nn.Sequential:
    """res``index`` (2..5): its blocks, the first one changing stride and channels."""
    cin = shape.width if index == 2 else shape.channels(index - 1)
    cout, width = shape.channels(index), shape.channels(index) // 4
    stride = {2: 1, 3: 2, 4: 2, 5: shape.res5_stride}[index]
    dilation = shape.res5_dilation if index == 5 else 1
    blocks = []
    for k in range(shape.blocks[index - 2]):
        blocks.append(Bottleneck(cin if k == 0 else cout, width, cout,
                                 stride=stride if k == 0 else 1, dilation=dilation,
                                 stride_in_1x1=shape.stride_in_1x1, frozen_norm=frozen_norm))
    return nn.Sequential(*blocks)


class Trunk(nn.Module):
    """stem, res2, res3, res4: the image at stride 16, the map the RPN and RoI pooling read."""

    def __init__(self, shape: ResNetShape, *, frozen_norm: bool = True):
        super().__init__()
        self.stem = Stem(shape.width, caffe_maxpool=shape.caffe_maxpool, frozen_norm=frozen_norm)
        self.res2 = stage(shape, 2, frozen_norm=frozen_norm)
        self.res3 = stage(shape, 3, frozen_norm=frozen_norm)
        self.res4 = stage(shape, 4, frozen_norm=frozen_norm)
        self.out_channels = shape.channels(4)

    def forward(self, x: Tensor) -> Tensor:
        return self.res4(self.res3(self.res2(self.stem(x))))  # [B, C4, H/16, W/16]
