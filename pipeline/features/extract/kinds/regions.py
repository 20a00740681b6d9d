"""Bottom-up region features from torchvision's Faster R-CNN, reached by composition.

The Top-Down captioner (Anderson et al. 2018) attends over a set of region
features per image. They are what the detector's box head computes for a box:
``roi_heads.box_roi_pool`` pools the backbone's feature maps over the box and
``roi_heads.box_head`` turns that into one vector (torchvision
``roi_heads.py``: ``box_features = self.box_head(box_features)``).
:class:`RegionFeatureExtractor` calls the detector's own parts in the same order
(transform, backbone, rpn, box_roi_pool, box_head, box_predictor) and keeps the
box head's output instead of throwing it away; nothing of torchvision is copied.

Three architectures (:func:`build_detector`):

``"fpn"``
    torchvision's ``fasterrcnn_resnet50_fpn`` exactly, so its COCO checkpoint
    (``fasterrcnn_resnet50_fpn_coco-258fb6c6.pth``) loads. Region feature: the
    TwoMLPHead's fc7 output, 1024-d.
``"c5"``
    the bottom-up layout: a ResNet trunk up to ``layer4`` (one feature map
    ``"0"``, stride 32), RoIAlign 7x7 on it, mean-pooled to one C-d vector per
    box (C = 512 or 2048, the ResNet's channels), a ``FastRCNNPredictor`` on top.
    Its trunk can be loaded from a plain torchvision ResNet classification
    state_dict (:func:`load_detector_weights` with ``kind="backbone"``).
``"c4"``
    the layout of the original bottom-up model (Anderson et al.: Faster R-CNN
    ResNet-101 C4): the trunk up to ``layer3`` (stride 16) feeds the RPN, RoIAlign
    14x14 on it, then ``layer4`` runs on each box and is mean-pooled (C-d) as the
    box head. Small objects keep their shape: a box a cell or two wide at stride 32
    is resampled from the stride-16 map and seen by ``layer4`` at full resolution.
    A ResNet classification state_dict loads into trunk and head together.

Each is a registered extractor kind (``--arch fpn|c4|c5``: :class:`TorchvisionRegions`,
settings :class:`TorchvisionRegionSettings`, at the end of this file).

Two modes (:meth:`RegionFeatureExtractor.forward`): ``boxes=None`` detects regions
with the bottom-up selection rule (``pipeline.features.detectors.selection``); given boxes (image
pixels) are pooled as they are.

Example::

    detector = build_detector("c5", backbone="resnet18", min_size=600, max_size=1000)
    load_detector_weights(detector, "resnet18_demo.pth")        # -> "backbone: ..."
    extractor = RegionFeatureExtractor(detector, min_boxes=10, max_boxes=100)
    [out] = extractor([image])          # image: [3, H, W] float in 0..1
    out["features"].shape               # [N, 512], 10 <= N <= 100
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.models.detection import FasterRCNN, fasterrcnn_resnet50_fpn
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.transform import resize_boxes
from torchvision.ops import MultiScaleRoIAlign
from torchvision.ops import boxes as box_ops

from pipeline.core.errors import CapstackError
from pipeline.core.hashing import md5_of_file
from pipeline.core.state_dicts import first_misfit, listed, require_finite
from pipeline.features.detectors.selection import RegionExtractor
from pipeline.features.extract.kinds import EXTRACTORS
from pipeline.features.extract.kinds.region_base import RegionKind, SharedRegionSettings
from pipeline.vision.backbones import BACKBONES, RANDOM, RANDOM_SEED, build_resnet, resolve_weights

ARCHS = ("fpn", "c5", "c4")
WEIGHT_KINDS = ("auto", "detector", "backbone")

# c4/c5 anchors: one feature map, so all sizes sit on it (bottom-up: scales 4..32 x stride 16).
SINGLE_MAP_ANCHOR_SIZES = ((32, 64, 128, 256, 512),)
SINGLE_MAP_ASPECT_RATIOS = ((0.5, 1.0, 2.0),)
C5_POOL_SIZE = 7
C4_POOL_SIZE = 14  # the bottom-up model's RoI pooling on res4, halved to 7x7 by res5


# --------------------------------------------------------------------------- building

def layer_channels(layer: nn.Sequential) -> int:
    """Output channels of a ResNet stage (its last block's last BatchNorm)."""
    last = layer[-1]
    norm = last.bn3 if hasattr(last, "bn3") else last.bn2
    return cast(nn.BatchNorm2d, norm).num_features


class ResNetTrunk(nn.Module):
    """A ResNet trunk (conv1 ... ``last``) as a FasterRCNN backbone: one map ``"0"``.

    ``body`` holds the ResNet's own module names (``conv1``, ``layer1`` ...), as in
    torchvision's ``BackboneWithFPN``, so a classification state_dict loads into it.
    ``last="layer4"``: stride 32 (c5); ``last="layer3"``: stride 16 (c4).
    """

    def __init__(self, resnet: nn.Module, last: str = "layer4"):
        super().__init__()
        self.out_channels = layer_channels(getattr(resnet, last))  # FasterRCNN reads this
        self.body = IntermediateLayerGetter(resnet, return_layers={last: "0"})

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        return self.body(x)  # {"0": [B, C, H/stride, W/stride]}


class Layer4BoxHead(nn.Module):
    """The c4 box head: ResNet ``layer4`` on each RoI's 14x14 cells, mean-pooled to C-d."""

    def __init__(self, layer4: nn.Sequential):
        super().__init__()
        self.layer4 = layer4
        self.out_channels = layer_channels(layer4)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer4(x).mean(dim=(2, 3))  # [R, C/2, 14, 14] -> [R, C, 7, 7] -> [R, C]


class MeanPoolBoxHead(nn.Module):
    """The c5 box head: average the RoI's C x 7 x 7 cells into one C-d vector."""

    def forward(self, x: Tensor) -> Tensor:
        return x.mean(dim=(2, 3))  # [R, C, 7, 7] -> [R, C]


def build_detector(arch: str = "fpn", *, backbone: str = "resnet50", num_classes: int = 91,
                   min_size: int = 600, max_size: int = 1000) -> FasterRCNN:
    """A randomly initialised Faster R-CNN of ``arch`` (load weights with
    :func:`load_detector_weights`).

    ``num_classes`` counts the background (COCO: 91, Visual Genome bottom-up: 1601).
    ``min_size``/``max_size`` set how GeneralizedRCNNTransform resizes each image.
    Nothing is downloaded.
    """
    if num_classes < 2:
        raise CapstackError(f"num_classes: expected at least 2 (background + 1), got {num_classes}")
    if arch == "fpn":
        if backbone != "resnet50":
            raise CapstackError(f"backbone: arch 'fpn' is torchvision's fasterrcnn_resnet50_fpn "
                                f"and needs resnet50, got {backbone!r} (use arch 'c4' or 'c5' "
                                f"for {', '.join(BACKBONES)})")
        return fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=num_classes,
                                       min_size=min_size, max_size=max_size)
    if arch in ("c4", "c5"):
        if backbone not in BACKBONES:
            raise CapstackError(f"backbone: unknown {backbone!r} for arch {arch!r} "
                                f"(choose {', '.join(BACKBONES)})")
        resnet = build_resnet(backbone)
        head: MeanPoolBoxHead | Layer4BoxHead
        if arch == "c5":
            body, pool, head = ResNetTrunk(resnet, "layer4"), C5_POOL_SIZE, MeanPoolBoxHead()
            head_channels = body.out_channels
        else:
            body, pool, head = (ResNetTrunk(resnet, "layer3"), C4_POOL_SIZE,
                                Layer4BoxHead(resnet.layer4))
            head_channels = head.out_channels
        return FasterRCNN(
            body, num_classes=None, min_size=min_size, max_size=max_size,
            rpn_anchor_generator=AnchorGenerator(SINGLE_MAP_ANCHOR_SIZES, SINGLE_MAP_ASPECT_RATIOS),
            box_roi_pool=MultiScaleRoIAlign(["0"], output_size=pool, sampling_ratio=2),
            box_head=head,
            box_predictor=FastRCNNPredictor(head_channels, num_classes),
        )
    raise CapstackError(f"arch: unknown {arch!r} (choose {', '.join(ARCHS)})")


# --------------------------------------------------------------------------- weights

def _read_state_dict(path: Path) -> dict[str, Tensor]:
    """The tensors of a state_dict file (a ``{"model": state_dict}`` checkpoint is unwrapped)."""
    if not path.is_file():
        raise CapstackError(f"{path}: detector weights not found (pass a state_dict file saved "
                            f"with torch.save; nothing is downloaded)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file
        raise CapstackError(f"{path}: cannot read weights ({type(e).__name__}: {e})") from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise CapstackError(f"{path}: not a state_dict (expected a dict of tensors)")
    require_finite(state, path)
    return state


def _guess_kind(path: Path, state: dict[str, Tensor]) -> str:
    """``"detector"`` for a whole FasterRCNN state_dict, ``"backbone"`` for a ResNet one."""
    if any(k.startswith(("backbone.", "rpn.", "roi_heads.")) for k in state):
        return "detector"
    if "conv1.weight" in state and any(k.startswith("layer1.") for k in state):
        return "backbone"
    first = ", ".join(list(state)[:3])
    raise CapstackError(f"{path}: neither a FasterRCNN nor a ResNet state_dict (keys {first}...); "
                        f"pass kind 'detector' or 'backbone'")


def _check_keys(path: Path, state: dict[str, Tensor], target: nn.Module, what: str) -> None:
    """Raise naming the first keys of ``state`` that do not fit ``target``'s state_dict."""
    misfit = first_misfit(state, target)
    if misfit:
        problem, keys = misfit
        hint = (" (build the detector with the checkpoint's num_classes)"
                if any("box_predictor" in k for k in keys) else "")
        raise CapstackError(f"{path}: does not fit the {what}: {problem} {listed(keys)}{hint}")


def load_detector_weights(model: FasterRCNN, path, *, kind: str = "auto") -> str:
    """Load a state_dict file into ``model``; returns what was loaded, in a few words.

    ``kind``: ``"detector"`` (a whole FasterRCNN state_dict), ``"backbone"`` (a
    torchvision ResNet classification state_dict, ``fc.*`` ignored, loaded into
    ``model.backbone.body``) or ``"auto"`` (decided by the keys). Every key is
    checked before anything is copied, so a refused file leaves ``model`` as it was.
    """
    if kind not in WEIGHT_KINDS:
        raise CapstackError(f"kind: unknown {kind!r} (choose {', '.join(WEIGHT_KINDS)})")
    path = Path(path)
    state = _read_state_dict(path)
    if kind == "auto":
        kind = _guess_kind(path, state)
    if kind == "detector":
        target, what = model, "detector"
    else:
        state = {k: v for k, v in state.items() if not k.startswith("fc.")}
        target, what = resnet_view(model), "detector's ResNet (backbone.body and a layer4 head)"
    _check_keys(path, state, target, what)
    target.load_state_dict(state, strict=False)  # only num_batches_tracked may be left out
    return f"{kind} weights ({len(state)} tensors) from {path.name} into {what}"


def resnet_view(model: FasterRCNN) -> nn.Module:
    """The detector's ResNet modules under a classification ResNet's names (shared, not copied).

    c5: the trunk is the whole ResNet; c4: ``layer4`` lives in the box head.
    Loading a ResNet state_dict into the view loads it into the detector.
    """
    view = nn.Module()
    for name, module in model.backbone.body.named_children():
        view.add_module(name, module)
    head = model.roi_heads.box_head
    if isinstance(head, Layer4BoxHead):
        view.add_module("layer4", head.layer4)
    return view


# --------------------------------------------------------------------------- extraction

class RegionFeatureExtractor(RegionExtractor):
    """Region features, boxes, scores and classes from a torchvision FasterRCNN.

    ``feature_dim`` is the box head's output size; ``layer`` describes it for the
    store's metadata. See :meth:`forward` for the two modes.
    """

    detector: FasterRCNN

    def __init__(self, detector: FasterRCNN, *, min_boxes: int = 10, max_boxes: int = 100,
                 conf_thresh: float = 0.2, nms_thresh: float = 0.3):
        super().__init__(detector, min_boxes=min_boxes, max_boxes=max_boxes,
                         conf_thresh=conf_thresh, nms_thresh=nms_thresh)
        predictor = detector.roi_heads.box_predictor
        self.feature_dim: int = predictor.cls_score.in_features
        if predictor.cls_score.out_features < 2:
            raise ValueError("the box predictor needs background + at least one class")
        self.layer: str = describe_layer(detector, self.feature_dim)

    @torch.inference_mode()
    def forward(self, images: list[Tensor], boxes: list[Tensor] | None = None) -> list[dict]:
        """Per image a dict: ``features`` [N, D], ``boxes`` [N, 4], ``scores`` [N], ``classes`` [N].

        images: [3, H, W] floats in 0..1, any sizes, one backbone call for all.
        boxes=None: detect (proposals kept by the selection rule; features are
        pooled on the proposal boxes, as in bottom-up, not on regressed boxes).
        boxes given: [N_i, 4] per image, x1, y1, x2, y2 in original image pixels;
        exactly those are pooled, in order, and returned unchanged.
        Returned boxes are in original image pixels (float32); ``scores`` are
        float32, ``classes`` int64 detector labels (1..num_classes-1, 0 is the
        background and never returned): the best foreground class.
        """
        if boxes is not None and len(boxes) != len(images):
            raise ValueError(f"got {len(images)} images but {len(boxes)} box lists")
        original_sizes = [(int(img.shape[-2]), int(img.shape[-1])) for img in images]
        given = None if boxes is None else [
            _as_boxes(b, i).to(img.device) for i, (img, b) in enumerate(zip(images, boxes))]
        targets = None if given is None else [{"boxes": b} for b in given]
        # the transform resizes given boxes exactly as it resizes their image
        image_list, targets = self.detector.transform(images, targets)  # tensors [B, 3, H', W']
        features = self.detector.backbone(image_list.tensors)  # {level: [B, C, h, w]}
        if isinstance(features, Tensor):
            features = OrderedDict([("0", features)])
        if targets is None:
            pooled_boxes, _ = self.detector.rpn(image_list, features)  # [P_i, 4] per image
        else:
            pooled_boxes = [t["boxes"] for t in targets]  # [N_i, 4], transformed pixels
        box_features, class_scores = self.box_features(features, pooled_boxes,
                                                       image_list.image_sizes)
        results = []
        for i, (feats, scores) in enumerate(zip(box_features, class_scores)):
            if given is None:
                keep, kept_scores = self.select(pooled_boxes[i].float(), scores)
                out_boxes = to_original(pooled_boxes[i][keep].float(), image_list.image_sizes[i],
                                        original_sizes[i])
                feats, scores = feats[keep], scores[keep]
            else:
                kept_scores = scores.max(dim=1).values if len(scores) else scores.new_zeros(0)
                out_boxes = given[i].clone()
            results.append({
                "features": feats.float(),  # [N, D]
                "boxes": out_boxes,  # [N, 4]
                "scores": kept_scores.float(),  # [N]
                "classes": best_class(scores),  # [N]
            })
        return results

    def box_features(self, features: dict[str, Tensor], boxes: list[Tensor],
                     image_sizes: list[tuple[int, int]]) -> tuple[list[Tensor], list[Tensor]]:
        """Box head output and foreground class probabilities for boxes in transformed pixels.

        -> per image: features [N_i, D], probabilities [N_i, num_classes - 1] (float32).
        """
        heads = self.detector.roi_heads
        pooled = heads.box_roi_pool(features, boxes, image_sizes)  # [sum N_i, C, 7, 7]
        feats = heads.box_head(pooled)  # [sum N_i, D]
        class_logits, _ = heads.box_predictor(feats)  # [sum N_i, num_classes]
        probs = F.softmax(class_logits.float(), dim=-1)[:, 1:]  # [sum N_i, K], background dropped
        counts = [len(b) for b in boxes]
        return list(feats.split(counts)), list(probs.split(counts))


def _as_boxes(boxes, index: int) -> Tensor:
    """Given boxes as a float32 [N, 4] tensor (0 boxes may come as any empty tensor)."""
    boxes = torch.as_tensor(boxes, dtype=torch.float32)
    if boxes.numel() == 0:
        return boxes.reshape(0, 4)
    if boxes.dim() != 2 or boxes.shape[1] != 4:
        raise ValueError(f"boxes[{index}]: expected [N, 4] (x1, y1, x2, y2), "
                         f"got {list(boxes.shape)}")
    return boxes


def to_original(boxes: Tensor, transformed_size: tuple[int, int],
                original_size: tuple[int, int]) -> Tensor:
    """Boxes in the transformed image's pixels -> the original image's, clipped to it. [N, 4]."""
    boxes = resize_boxes(boxes, list(transformed_size), list(original_size))
    return box_ops.clip_boxes_to_image(boxes, original_size)


def best_class(class_scores: Tensor) -> Tensor:
    """Foreground probabilities [N, K] -> detector label of the best class [N] (1..K)."""
    if class_scores.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64, device=class_scores.device)
    return class_scores.argmax(dim=1) + 1


def describe_layer(detector: FasterRCNN, dim: int) -> str:
    """Where the region features come from, in words, for the store's metadata."""
    head = detector.roi_heads.box_head
    if isinstance(head, TwoMLPHead):
        return f"roi_heads.box_head (TwoMLPHead fc7 output, {dim}-d)"
    if isinstance(head, MeanPoolBoxHead):
        size = detector.roi_heads.box_roi_pool.output_size
        return (f"RoIAlign {size[0]}x{size[1]} on layer4 (stride 32), mean-pooled ({dim}-d)")
    if isinstance(head, Layer4BoxHead):
        size = detector.roi_heads.box_roi_pool.output_size
        return (f"RoIAlign {size[0]}x{size[1]} on layer3 (stride 16), layer4, mean-pooled "
                f"({dim}-d)")
    return f"roi_heads.box_head ({type(head).__name__} output, {dim}-d)"


# --------------------------------------------------------------------------- the kinds

FPN_COCO_WEIGHTS = "fasterrcnn_resnet50_fpn_coco-258fb6c6.pth"


@dataclass
class TorchvisionRegionSettings(SharedRegionSettings):
    """``--arch fpn|c4|c5``: the shared region settings and the torchvision detector's own."""

    arch: str = "fpn"  # which of the three
    backbone: str = "resnet50"
    weights_kind: str = "auto"  # detector | backbone | auto (see load_detector_weights)
    num_classes: int = 91  # incl. the background: COCO 91, Visual Genome 1601


class TorchvisionRegions(RegionKind):
    """A torchvision Faster R-CNN of :func:`build_detector`; ``resnet_trunk``: a plain
    ResNet's (ImageNet) weights can start it, which is what it loads without ``--weights``."""

    Settings = TorchvisionRegionSettings

    def __init__(self, name: str, summary: str, resnet_trunk: bool):
        super().__init__(name)
        self.__doc__ = summary  # what `--arch` lists it as
        self.resnet_trunk = resnet_trunk

    def settings(self, **options) -> TorchvisionRegionSettings:
        if options.setdefault("arch", self.name) != self.name:
            raise CapstackError(f"arch: {options['arch']!r} given to the kind {self.name!r}")
        return cast(TorchvisionRegionSettings, super().settings(**options))  # self.Settings'

    def accepts(self, settings) -> bool:
        return type(settings) is self.Settings and settings.arch == self.name

    def weights_file(self, s: TorchvisionRegionSettings) -> tuple[str, str]:
        if s.weights == RANDOM or (s.weights is None and self.resnet_trunk):
            w = resolve_weights(s.backbone, s.weights)  # without a file: the ImageNet ResNet cache
            return w.path, w.md5
        if s.weights:
            path = Path(s.weights).expanduser().resolve()
            if not path.is_file():
                raise CapstackError(f"{s.weights}: detector weights not found")
            return str(path), md5_of_file(path)
        cached = Path(torch.hub.get_dir()) / "checkpoints" / FPN_COCO_WEIGHTS
        if not cached.is_file():
            raise CapstackError(f"no detector weights: put torchvision's COCO Faster R-CNN "
                                f"state_dict at {cached}, or pass --weights PATH (a detector, or "
                                f"a ResNet for --arch c4 or c5); --weights random gives "
                                f"meaningless random features")
        return str(cached), md5_of_file(cached)

    def build(self, s: TorchvisionRegionSettings, weights_path: str,
              weights_md5: str | None = None) -> RegionFeatureExtractor:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(RANDOM_SEED)  # random parts are the same in every run (resume)
            detector = build_detector(self.name, backbone=s.backbone, num_classes=s.num_classes,
                                      min_size=s.min_size, max_size=s.max_size)
        if weights_path != RANDOM:
            kind = "backbone" if s.weights is None and self.resnet_trunk else s.weights_kind
            load_detector_weights(detector, weights_path, kind=kind)
        return RegionFeatureExtractor(detector, min_boxes=s.min_boxes, max_boxes=s.max_boxes,
                                      conf_thresh=s.conf_thresh, nms_thresh=s.nms_thresh)

    def detector_settings(self, s: TorchvisionRegionSettings, probe) -> tuple[str, dict, dict]:
        return s.backbone, {"weights_kind": s.weights_kind, "num_classes": s.num_classes}, {}


for _kind in (
        TorchvisionRegions("fpn", "torchvision's fasterrcnn_resnet50_fpn (1024-d box head; "
                                  "--weights its COCO state_dict)", resnet_trunk=False),
        TorchvisionRegions("c4", "RoIAlign 14x14 on a torchvision ResNet's layer3, then layer4, "
                                 "mean-pooled (the bottom-up layout)", resnet_trunk=True),
        TorchvisionRegions("c5", "RoIAlign 7x7 on a torchvision ResNet's layer4, mean-pooled",
                           resnet_trunk=True)):
    EXTRACTORS.register(_kind.name)(_kind)
del _kind
