"""What the bottom-up model computes per region, from res4 and a box.

``BoxHead``: Caffe's ROIPooling (max over 14x14 bins at stride 16, the bin
edges rounded as Caffe rounds them: ``torchvision.ops.roi_pool`` is that
operator), then res5 on each region (the VG model: 14x14 kept, stride 1,
dilation 2; see :class:`ResNetShape`), then the spatial mean: the region's
feature ("pool5" global average, "pool5_flat", 2048-d for R101).

``ObjectPredictor``: class logits (background is class 0, as in Caffe) and
per-class box deltas. ``AttributePredictor``: the Caffe attribute branch, the
region's feature concatenated with an embedding of its object class (the
predicted one at test time, ArgMax over all 1601 scores, background included;
the ground truth's in training), a hidden layer with
ReLU, and attribute logits (class 0: no attribute).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import roi_pool

from pipeline.features.detectors.caffe_resnet import ResNetShape, stage


class BoxHead(nn.Module):
    def __init__(self, shape: ResNetShape, *, pool_size: int = 14, stride: int = 16,
                 frozen_norm: bool = True):
        super().__init__()
        self.pool_size, self.spatial_scale = pool_size, 1.0 / stride
        self.res5 = stage(shape, 5, frozen_norm=frozen_norm)
        self.out_channels = shape.channels(5)

    def pool(self, fmap: Tensor, rois: Tensor) -> Tensor:
        """rois [R, 5] (image index, x1, y1, x2, y2 in resized pixels) -> [R, C4, 14, 14]."""
        return roi_pool(fmap, rois, output_size=self.pool_size, spatial_scale=self.spatial_scale)

    def forward(self, fmap: Tensor, rois: Tensor) -> Tensor:
        return self.res5(self.pool(fmap, rois)).mean(dim=(2, 3))  # [R, C5]


class ObjectPredictor(nn.Module):
    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        self.cls_score = nn.Linear(channels, num_classes)
        self.bbox_pred = nn.Linear(channels, 4 * num_classes)

    def forward(self, features: Tensor) -> tuple[Tensor, Tensor]:
        return self.cls_score(features), self.bbox_pred(features)  # [R, K], [R, 4K]


class AttributePredictor(nn.Module):
    def __init__(self, channels: int, num_classes: int, num_attributes: int, *,
                 embedding: int = 256, hidden: int = 512):
        super().__init__()
        self.class_embedding = nn.Embedding(num_classes, embedding)
        self.fc = nn.Linear(channels + embedding, hidden)
        self.attr_score = nn.Linear(hidden, num_attributes)

    def forward(self, features: Tensor, classes: Tensor) -> Tensor:
        """features [R, C], object classes [R] -> attribute logits [R, num_attributes]."""
        x = torch.cat([features, self.class_embedding(classes)], dim=1)
        return self.attr_score(F.relu(self.fc(x)))
