"""Training targets and losses of the bottom-up detector (py-faster-rcnn's TRAIN rules).

RPN (``anchor_target_layer``): anchors that cross the image border are
ignored; an anchor is foreground at IoU >= 0.7 with a ground-truth box (and the
best anchor of every box is too), background under 0.3; 256 anchors per image,
at most half foreground. Losses: binary cross-entropy on the objectness logit,
smooth L1 (sigma 3, i.e. beta 1/9) on the deltas of foreground anchors.

Detection head (``proposal_target_layer``): the proposals plus the ground-truth
boxes; foreground at IoU >= 0.5 (labelled with its box's class), background
below 0.5; ``rois`` per image, a quarter foreground. Losses: cross-entropy on
the classes, smooth L1 on the class's deltas (normalised by the stds
0.1, 0.1, 0.2, 0.2, which the saved weights fold back in), and cross-entropy on
the attribute of each foreground region, given its true class as the Caffe
attribute branch is trained. IoUs use Caffe's inclusive boxes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.models.detection._utils import BalancedPositiveNegativeSampler, Matcher
from torchvision.ops import box_iou

from pipeline.features.detectors import boxes as caffe_boxes

BBOX_STDS = (0.1, 0.1, 0.2, 0.2)


def caffe_iou(a: Tensor, b: Tensor) -> Tensor:
    return box_iou(caffe_boxes.inclusive(a), caffe_boxes.inclusive(b))


def _sample(labels: Tensor, per_image: int, positive_fraction: float) -> tuple[Tensor, Tensor]:
    """Indices of the sampled positives and negatives (labels: 1, 0, or -1 to ignore)."""
    sampler = BalancedPositiveNegativeSampler(per_image, positive_fraction)
    pos, neg = sampler([labels])
    return pos[0].nonzero().squeeze(1), neg[0].nonzero().squeeze(1)


def rpn_loss(logits: Tensor, deltas: Tensor, anchors: Tensor, gt: Tensor,
             image_size: tuple[int, int], per_image: int = 256) -> tuple[Tensor, Tensor]:
    """One image: (objectness loss, box loss). logits [N], deltas [N, 4], anchors [N, 4]."""
    height, width = image_size
    inside = ((anchors[:, 0] >= 0) & (anchors[:, 1] >= 0) & (anchors[:, 2] < width)
              & (anchors[:, 3] < height))
    labels = torch.full_like(logits, -1.0)
    if len(gt):
        match = Matcher(0.7, 0.3, allow_low_quality_matches=True)(caffe_iou(gt, anchors))
        labels[match >= 0] = 1.0
        labels[match == Matcher.BELOW_LOW_THRESHOLD] = 0.0
    else:
        match = torch.full_like(logits, -1, dtype=torch.int64)
        labels[:] = 0.0
    labels[~inside] = -1.0
    pos, neg = _sample(labels, per_image, 0.5)
    sampled = torch.cat([pos, neg])
    objectness = F.binary_cross_entropy_with_logits(logits[sampled], labels[sampled])
    if len(pos) == 0:
        return objectness, deltas.sum() * 0.0
    targets = caffe_boxes.encode(gt[match[pos]], anchors[pos])
    box = F.smooth_l1_loss(deltas[pos], targets, beta=1 / 9, reduction="sum") / max(len(sampled), 1)
    return objectness, box


def sample_rois(proposals: Tensor, gt: Tensor, gt_labels: Tensor, per_image: int,
                foreground_fraction: float = 0.25) -> tuple[Tensor, Tensor, Tensor]:
    """One image: sampled rois [R, 4], their classes [R] (0: background), matched gt index [R]."""
    rois = torch.cat([proposals, gt])
    if len(gt) == 0:
        keep = torch.randperm(len(rois), device=rois.device)[:per_image]
        zeros = torch.zeros(len(keep), dtype=torch.int64, device=rois.device)
        return rois[keep], zeros, zeros
    iou = caffe_iou(gt, rois)  # [G, R]
    best, matched = iou.max(dim=0)
    labels = (best >= 0.5).long()
    pos, neg = _sample(labels, per_image, foreground_fraction)
    keep = torch.cat([pos, neg])
    classes = gt_labels[matched[keep]] * labels[keep]
    return rois[keep], classes, matched[keep]


def head_loss(class_logits: Tensor, box_deltas: Tensor, rois: Tensor, classes: Tensor,
              targets: Tensor) -> tuple[Tensor, Tensor]:
    """(classification loss, box loss) over all sampled rois; targets: matched gt boxes [R, 4]."""
    classification = F.cross_entropy(class_logits, classes)
    foreground = classes > 0
    if not foreground.any():
        return classification, box_deltas.sum() * 0.0
    deltas = box_deltas.reshape(len(rois), -1, 4)[foreground, classes[foreground]]  # [F, 4]
    wanted = caffe_boxes.encode(targets[foreground], rois[foreground])
    wanted = wanted / wanted.new_tensor(BBOX_STDS)
    box = F.smooth_l1_loss(deltas, wanted, beta=1.0, reduction="sum") / len(rois)
    return classification, box
