"""The bottom-up detector as one module: settings, and its outputs per image.

The network is the Caffe model's (trunk, RPN head, box head, object and
attribute predictors). What is done around it at test time, the input's scaling,
the anchors, the proposals and which regions are kept, follows one reference
implementation's rules (:mod:`pipeline.features.detectors.rules`): Caffe's
``generate_tsv.py`` by default, or MMF's frcnn extractor. Images are run one size
at a time, never padded into a batch: a padded border would change the
convolutions near it, which the Caffe model, fed one image at a time, never saw.

:meth:`BottomUpDetector.forward` gives, per image, the RPN's proposals (in the
original image's pixels and in the network input's), each one's feature, its
object class probabilities, its per-class box deltas and, per proposal, the
attribute probabilities given its most likely object class.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.features.detectors.caffe_resnet import ResNetShape, Trunk
from pipeline.features.detectors.heads import AttributePredictor, BoxHead, ObjectPredictor
from pipeline.features.detectors.rpn import ProposalGenerator, ProposalSettings, RPNHead
from pipeline.features.detectors.rules import DEFAULT, RULES
from pipeline.features.detectors.rules.base import DetectorRules

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

    boxes: Tensor  # [P, 4] original image pixels (the rules' convention)
    features: Tensor  # [P, D]
    class_probs: Tensor  # [P, num_classes], background first
    attribute_probs: Tensor | None = None  # [P, num_attributes], "no attribute" first
    proposals: Tensor | None = None  # [P, 4] the boxes in the network input's pixels
    box_deltas: Tensor | None = None  # [P, 4 * num_classes] per-class regression
    input_size: tuple[int, int] = (0, 0)  # the network input's (h, w)
    scale: object = 1.0  # the rules' scale of this image (:meth:`DetectorRules.network_input`)


class BottomUpDetector(nn.Module):
    def __init__(self, config: DetectorConfig = DetectorConfig(), *, frozen_norm: bool = True,
                 rules: str = DEFAULT, file_anchors: Tensor | None = None):
        super().__init__()
        self.config = config
        anchors = len(config.proposals.ratios) * len(config.proposals.scales)
        self.backbone = Trunk(config.resnet, frozen_norm=frozen_norm)
        self.rpn = RPNHead(self.backbone.out_channels, config.rpn_channels, anchors)
        self.proposals = ProposalGenerator(config.proposals)
        self.file_anchors = file_anchors  # a checkpoint's own, in the RPN's channel order
        self.follow(rules)
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

    def follow(self, rules: str) -> BottomUpDetector:
        """Run by the test-time rules of reference ``rules`` (a name in ``RULES``)."""
        self.rules: DetectorRules = RULES.get(rules)
        cell = self.rules.cell_anchors(self.config.proposals, self.file_anchors)
        self.proposals.use_cell(cell.to(self.proposals.cell.device))
        return self

    def prepare(self, images: list[Tensor]) -> list[tuple[Tensor, float | Tensor]]:
        """Each image as the network's input, with its scale (the rules')."""
        return [self.rules.network_input(img, self.config) for img in images]

    def res4(self, inputs: list[Tensor]) -> list[Tensor]:
        """The trunk's map of each input, images of one size batched together."""
        by_size: dict[tuple[int, int], list[int]] = {}
        for k, x in enumerate(inputs):
            by_size.setdefault((x.shape[-2], x.shape[-1]), []).append(k)
        maps: list[Tensor | None] = [None] * len(inputs)
        for indices in by_size.values():
            out = self.backbone(torch.stack([inputs[k] for k in indices]))
            for k, m in zip(indices, out):
                maps[k] = m
        return cast("list[Tensor]", maps)  # each input is in its size's batch

    def describe(self, fmap: Tensor, boxes: Tensor
                 ) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
        """Boxes [R, 4] in the resized image -> features, class probs, attribute probs and
        the per-class box deltas [R, 4K]."""
        rois = torch.cat([boxes.new_zeros(len(boxes), 1), boxes], dim=1)
        features = self.box_head(fmap[None], rois)  # [R, D]
        class_logits, box_deltas = self.predictor(features)
        class_probs = F.softmax(class_logits.float(), dim=1)
        attribute_probs = None
        if self.attributes is not None:
            predicted = class_probs.argmax(dim=1)  # Caffe: ArgMax over cls_prob, background too
            attribute_probs = F.softmax(self.attributes(features, predicted).float(), dim=1)
        return features, class_probs, attribute_probs, box_deltas

    @torch.inference_mode()
    def forward(self, images: list[Tensor], boxes: list[Tensor] | None = None) -> list[Detections]:
        """Per image its proposals (or the ``boxes`` given, original pixels) and their outputs."""
        prepared = self.prepare(images)
        maps = self.res4([x for x, _ in prepared])
        out = []
        for k, ((x, scale), fmap) in enumerate(zip(prepared, maps)):
            size = (x.shape[-2], x.shape[-1])
            if boxes is None:
                objectness, deltas = self.rpn(fmap[None])
                regions = self.rules.proposals(self.proposals, objectness[0], deltas[0], size,
                                               scale)
            else:
                regions = self.rules.to_input(boxes[k].to(fmap.device, torch.float32), scale)
            features, class_probs, attribute_probs, box_deltas = self.describe(fmap, regions)
            out.append(Detections(self.rules.to_original(regions, scale), features.float(),
                                  class_probs, attribute_probs, proposals=regions,
                                  box_deltas=box_deltas, input_size=size, scale=scale))
        return out
