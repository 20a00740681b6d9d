"""The bottom-up detector as one module: settings, preprocessing, and its outputs per image.

Preprocessing is the Caffe model's (``fast_rcnn/test.py: _get_image_blob``):
the image in BGR order, 0..255, minus the Caffe pixel means, no division by a
std; scaled so that the shorter side is ``min_size`` unless the longer one would
exceed ``max_size`` (then the longer side is ``max_size``); resized bilinearly
as ``cv2.resize(fx=scale, fy=scale)`` does (output side rounded, sampling at
1/scale). Images are run one size at a time, never padded into a batch: a
padded border would change the convolutions near it, which the Caffe model,
fed one image at a time, never saw.

:meth:`BottomUpDetector.forward` gives, per image, the RPN's proposals in the
original image's pixels (``generate_tsv.py`` keeps the proposals, not the
regressed boxes), each one's feature, its object class probabilities and, per
proposal, the attribute probabilities given its most likely object class.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.features.detectors.caffe_resnet import ResNetShape, Trunk
from pipeline.features.detectors.heads import AttributePredictor, BoxHead, ObjectPredictor
from pipeline.features.detectors.rpn import ProposalGenerator, ProposalSettings, RPNHead

CAFFE_PIXEL_MEANS_BGR = (102.9801, 115.9465, 122.7717)


@dataclass(frozen=True)
class DetectorConfig:
    """Everything that shapes the network; defaults: the Visual Genome ResNet-101 model."""

    resnet: ResNetShape = ResNetShape()
    num_classes: int = 1601  # object classes, background (0) included
    num_attributes: int = 401  # attributes, "no attribute" (0) included; 0: no attribute head
    rpn_channels: int = 512
    pool_size: int = 14
    attribute_embedding: int = 256
    attribute_hidden: int = 512
    proposals: ProposalSettings = ProposalSettings()
    pixel_means_bgr: tuple[float, float, float] = CAFFE_PIXEL_MEANS_BGR
    min_size: int = 600
    max_size: int = 1000

    @property
    def feature_dim(self) -> int:
        return self.resnet.channels(5)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> DetectorConfig:
        d = dict(d)
        resnet = d.pop("resnet")
        resnet = ResNetShape(**{**resnet, "blocks": tuple(resnet["blocks"])})
        proposals = d.pop("proposals")
        proposals = ProposalSettings(**{**proposals, "ratios": tuple(proposals["ratios"]),
                                        "scales": tuple(proposals["scales"])})
        return cls(resnet=resnet, proposals=proposals,
                   pixel_means_bgr=tuple(d.pop("pixel_means_bgr")), **d)

    def resized(self, min_size: int, max_size: int) -> DetectorConfig:
        return replace(self, min_size=min_size, max_size=max_size)


@dataclass
class Detections:
    """One image's proposals and what the detector says of each (P rows)."""

    boxes: Tensor  # [P, 4] original image pixels, Caffe's inclusive convention
    features: Tensor  # [P, D]
    class_probs: Tensor  # [P, num_classes], background first
    attribute_probs: Tensor | None = None  # [P, num_attributes], "no attribute" first
    extra: dict = field(default_factory=dict)


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


class BottomUpDetector(nn.Module):
    def __init__(self, config: DetectorConfig = DetectorConfig(), *, frozen_norm: bool = True):
        super().__init__()
        self.config = config
        anchors = len(config.proposals.ratios) * len(config.proposals.scales)
        self.backbone = Trunk(config.resnet, frozen_norm=frozen_norm)
        self.rpn = RPNHead(self.backbone.out_channels, config.rpn_channels, anchors)
        self.proposals = ProposalGenerator(config.proposals)
        self.box_head = BoxHead(config.resnet, pool_size=config.pool_size,
                                stride=config.proposals.stride, frozen_norm=frozen_norm)
        self.predictor = ObjectPredictor(self.box_head.out_channels, config.num_classes)
        self.attributes = (AttributePredictor(self.box_head.out_channels, config.num_classes,
                                              config.num_attributes,
                                              embedding=config.attribute_embedding,
                                              hidden=config.attribute_hidden)
                           if config.num_attributes else None)

    @property
    def feature_dim(self) -> int:
        return self.box_head.out_channels

    def prepare(self, images: list[Tensor]) -> list[tuple[Tensor, float]]:
        """Each image as the network's input, with its scale (resized / original)."""
        c = self.config
        scales = [scale_for(*img.shape[-2:], c.min_size, c.max_size) for img in images]
        return [(caffe_input(img, scale, c.pixel_means_bgr), scale)
                for img, scale in zip(images, scales)]

    def res4(self, inputs: list[Tensor]) -> list[Tensor]:
        """The trunk's map of each input, images of one size batched together."""
        by_size: dict[tuple[int, int], list[int]] = {}
        for k, x in enumerate(inputs):
            by_size.setdefault(tuple(x.shape[-2:]), []).append(k)
        maps: list[Tensor | None] = [None] * len(inputs)
        for indices in by_size.values():
            out = self.backbone(torch.stack([inputs[k] for k in indices]))
            for k, m in zip(indices, out):
                maps[k] = m
        return maps

    def describe(self, fmap: Tensor, boxes: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """Boxes [R, 4] in the resized image -> features, class probs, attribute probs."""
        rois = torch.cat([boxes.new_zeros(len(boxes), 1), boxes], dim=1)
        features = self.box_head(fmap[None], rois)  # [R, D]
        class_logits, _ = self.predictor(features)
        class_probs = F.softmax(class_logits.float(), dim=1)
        attribute_probs = None
        if self.attributes is not None:
            predicted = class_probs.argmax(dim=1)  # Caffe: ArgMax over cls_prob, background too
            attribute_probs = F.softmax(self.attributes(features, predicted).float(), dim=1)
        return features, class_probs, attribute_probs

    @torch.inference_mode()
    def forward(self, images: list[Tensor], boxes: list[Tensor] | None = None) -> list[Detections]:
        """Per image its proposals (or the ``boxes`` given, original pixels) and their outputs."""
        prepared = self.prepare(images)
        maps = self.res4([x for x, _ in prepared])
        out = []
        for k, ((x, scale), fmap) in enumerate(zip(prepared, maps)):
            if boxes is None:
                objectness, deltas = self.rpn(fmap[None])
                regions, _ = self.proposals(objectness[0], deltas[0], tuple(x.shape[-2:]), scale)
            else:
                regions = boxes[k].to(fmap.device, torch.float32) * scale
            features, class_probs, attribute_probs = self.describe(fmap, regions)
            out.append(Detections(regions / scale, features.float(), class_probs, attribute_probs))
        return out
