"""capstack's bottom-up detector with ``--reference mmf`` beside MMF's own frcnn code.

facebookresearch/mmf's ``tools/scripts/features/frcnn`` (``GeneralizedRCNN`` in
``modeling_frcnn.py``, ``Preprocess`` in ``processing_image.py``) is built at the
Visual Genome model's real shapes: ResNet-101 C4, 1,600 classes and 400 attributes
(each with its background / "no attribute"), 12 anchors of 64 to 512 px, a
512-channel RPN, res5 at stride 1 and dilation 2. Its own modules initialise it
(seeded); the norms' statistics and the heads are then redrawn wider, so that
norms count and detections are decided by clear margins, as a trained model's are.
Its state_dict is saved as MMF saves ``pytorch_model.bin``, and capstack loads that
file (naming ``detectron2``) with the ``mmf`` rules. Both run, each through its own
preprocessing, on the same drawn images (one at a time, MMF's default batch), in
float32 on the CPU, and compare:

- every anchor of the image's res4 map (MMF's ``AnchorGenerator``, the checkpoint's
  cell anchors, in capstack's channel order);
- the proposals (MMF's RPN output, resized pixels), 1e-3 px;
- the detected boxes (original pixels), 1e-3 px; their classes, scores, attributes;
- the region features, 1e-5 relative to their largest value.

MMF's modules import a few of its packages for downloads and its processor
registry (``mmf.utils.download``, ``mmf.utils.configuration``, ``mmf.common.registry``,
``mmf.datasets.processors.processors``); those are given empty stand-ins here, so that
the rest of MMF (and its own dependencies) need not be installed. Nothing they hold is
computed. ``requests``, ``filelock`` and ``omegaconf``, which ``frcnn_utils`` imports,
must be importable (``pip install --target PEER_DEPS requests filelock omegaconf``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import tempfile
import types
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.peer_parity import Difference, importable

from pipeline.features.detectors.checkpoints import (ANCHORS_KEY, NAMINGS, anchor_order,
                                                     load_detector)
from pipeline.features.detectors.detector import CAFFE_PIXEL_MEANS_BGR
from pipeline.features.detectors.regions import BottomUpRegions

FRCNN = "tools/scripts/features/frcnn"
IMAGE_SIDES = ((375, 500), (480, 360))  # (h, w): one landscape, one portrait
MIN_BOXES, MAX_BOXES, NMS = 10, 100, 0.3  # MMF's min/max_detections, nms_thresh_test
PIXEL_BOUND, FEATURE_BOUND = 1e-3, 1e-5
SEED = 0


def vg_config() -> dict:
    """MMF's config keys for the VG model (the values of its frcnn-vg-finetuned model)."""
    return {
        "model": {"device": "cpu", "pixel_mean": list(CAFFE_PIXEL_MEANS_BGR),
                  "pixel_std": [1.0, 1.0, 1.0], "max_pool": True},
        "resnets": {"norm": "BN", "stem_out_channels": 64, "out_features": ["res4"],
                    "depth": 101, "num_groups": 1, "width_per_group": 64,
                    "res2_out_channels": 256, "stride_in_1x1": True, "res5_dilation": 1},
        "backbone": {"freeze_at": 2},
        "proposal_generator": {"min_size": 0, "hidden_channels": 512},
        "rpn": {"in_features": ["res4"], "nms_thresh": 0.7, "batch_size_per_image": 256,
                "positive_fraction": 0.5, "smooth_l1_beta": 0.0, "loss_weight": 1.0,
                "pre_nms_topk_train": 12000, "pre_nms_topk_test": 6000,
                "post_nms_topk_train": 2000, "post_nms_topk_test": 300, "boundary_thresh": -1,
                "bbox_reg_weights": [1.0, 1.0, 1.0, 1.0], "iou_thresholds": [0.3, 0.7],
                "iou_labels": [0, -1, 1]},
        "anchor_generator": {"sizes": [[64, 128, 256, 512]], "aspect_ratios": [[0.5, 1.0, 2.0]],
                             "offset": 0.0},
        "roi_heads": {"positive_fraction": 0.25, "in_features": ["res4"], "num_classes": 1600,
                      "proposal_append_gt": True, "score_thresh_test": 0.2,
                      "nms_thresh_test": [NMS], "iou_thresholds": [0.5], "iou_labels": [0, 1]},
        "roi_box_head": {"cls_agnostic_bbox_reg": False, "pooler_resolution": 14,
                         "pooler_sampling_ratio": 0, "res5halve": False, "attr": True,
                         "num_attrs": 400, "smooth_l1_beta": 0.0,
                         "bbox_reg_weights": [10.0, 10.0, 5.0, 5.0]},
        "min_detections": MIN_BOXES, "max_detections": MAX_BOXES,
        "input": {"min_size_test": 600, "max_size_test": 1000, "format": "BGR"},
        "size_divisibility": 0, "pad_value": 0,
    }


def stand_ins() -> dict[str, types.ModuleType]:
    """Empty modules for MMF's download helpers and processor registry (nothing computed)."""
    def module(name: str, **attrs) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__path__ = []  # a package, so submodules can sit under it
        m.__dict__.update(attrs)
        return m

    registry = types.SimpleNamespace(register_processor=lambda name: (lambda cls: cls))
    return {name: module(name, **attrs) for name, attrs in {
        "mmf": {}, "mmf.utils": {}, "mmf.common": {}, "mmf.datasets": {},
        "mmf.datasets.processors": {},
        "mmf.utils.configuration": {"get_mmf_cache_dir": lambda: tempfile.gettempdir()},
        "mmf.utils.download": {"download": None, "get_image_from_url": None},
        "mmf.common.registry": {"registry": registry},
        "mmf.datasets.processors.processors": {"BaseProcessor": object},
    }.items()}


def load_peer(peer_dir: Path):
    """MMF's modeling, preprocessing and config modules, its own files."""
    sys.modules.update(stand_ins())
    spec = importlib.util.spec_from_file_location(
        "mmf.datasets.processors.frcnn_processor",
        peer_dir / "mmf/datasets/processors/frcnn_processor.py")
    processor = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = processor
    spec.loader.exec_module(processor)
    modeling = importlib.import_module(FRCNN.replace("/", ".") + ".modeling_frcnn")
    processing = importlib.import_module(FRCNN.replace("/", ".") + ".processing_image")
    utils = importlib.import_module(FRCNN.replace("/", ".") + ".frcnn_utils")
    return modeling, processing, utils


def peer_model(modeling, utils):
    """MMF's GeneralizedRCNN at the VG shapes, initialised by its modules, then widened."""
    torch.manual_seed(SEED)
    model = modeling.GeneralizedRCNN(utils.Config(vg_config())).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):  # statistics a trained model would have
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
        predictor = model.roi_heads.box_predictor
        for layer, std in ((predictor.cls_score, 0.05), (predictor.bbox_pred, 0.01),
                           (model.proposal_generator.rpn_head.objectness_logits, 0.05),
                           (model.proposal_generator.rpn_head.anchor_deltas, 0.01)):
            layer.weight.normal_(std=std)
            layer.bias.normal_(std=std)
    return model


def drawn_images() -> list[torch.Tensor]:
    """Smooth coloured images [3, H, W] of 8-bit values (as a decoded file gives), 0..255."""
    g = torch.Generator().manual_seed(SEED)
    images = []
    for h, w in IMAGE_SIDES:
        coarse = torch.rand(1, 3, h // 16, w // 16, generator=g)
        image = F.interpolate(coarse, (h, w), mode="bicubic", align_corners=False)[0]
        images.append((image.clamp(0, 1) * 255).round())
    return images


def largest(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest absolute difference, or inf when the shapes differ."""
    return float((a - b).abs().max()) if a.shape == b.shape and a.numel() else \
        (0.0 if a.shape == b.shape else float("inf"))


def compare_image(k: int, image: torch.Tensor, model, preprocess, ours: BottomUpRegions,
                  order: list[int]) -> list[Difference]:
    """One image through both; ``order``: MMF's anchor row of each of capstack's channels."""
    h, w = image.shape[-2:]
    label = f"image {k} ({h}x{w})"
    with torch.no_grad():
        batch, sizes, scales_yx = preprocess([image.permute(1, 2, 0).clone()])
        features = model.backbone(batch)
        [anchors] = model.proposal_generator.anchor_generator([features["res4"]])[0]
        proposals, _ = model.proposal_generator(batch, sizes, features)
        theirs = model(batch, sizes, scales_yx=scales_yx, padding=None,
                       max_detections=MAX_BOXES, return_tensors="pt")
    detector = ours.detector
    with torch.inference_mode():
        [(x, scale)] = detector.prepare([image / 255.0])
        [fmap] = detector.res4([x])
        objectness, deltas = detector.rpn(fmap[None])
        our_anchors = detector.proposals.anchors(*fmap.shape[-2:])
        our_proposals = detector.rules.proposals(detector.proposals, objectness[0], deltas[0],
                                                 tuple(x.shape[-2:]), scale)
        [region] = ours([image / 255.0])
    their_anchors = anchors.reshape(-1, len(detector.proposals.cell), 4)[:, order]
    boxes, feats = theirs["boxes"][0], theirs["roi_features"][0]
    same_count = len(region["boxes"]) == len(boxes)
    classes = int((region["classes"] != theirs["obj_ids"][0] + 1).sum()) if same_count else -1
    attributes = (int((region["attributes"][:, 0] != theirs["attr_ids"][0] + 1).sum())
                  if same_count else -1)
    return [
        Difference("mmf", f"{label}: input (BGR minus means) after MMF's resize",
                   largest(x, batch[0]), PIXEL_BOUND),
        Difference("mmf", f"{label}: anchors, every cell of the res4 map",
                   largest(our_anchors, their_anchors.reshape(-1, 4)), PIXEL_BOUND,
                   f"{len(our_anchors)} anchors"),
        Difference("mmf", f"{label}: proposals (resized pixels)",
                   largest(our_proposals, proposals[0]), PIXEL_BOUND,
                   f"{len(proposals[0])} proposals"),
        Difference("mmf", f"{label}: detected boxes (original pixels)",
                   largest(region["boxes"], boxes), PIXEL_BOUND, f"{len(boxes)} regions"),
        Difference("mmf", f"{label}: region features, relative to the largest",
                   largest(region["features"], feats) / float(feats.abs().max()), FEATURE_BOUND),
        Difference("mmf", f"{label}: class scores", largest(region["scores"],
                                                            theirs["obj_probs"][0]), 1e-6),
        Difference("mmf", f"{label}: regions whose class or top attribute differs",
                   classes + attributes if same_count else float("inf"), 0),
        Difference("mmf", f"{label}: top attribute probabilities",
                   largest(region["attribute_scores"][:, 0], theirs["attr_probs"][0]), 1e-5),
    ]


def check(peer_dir: Path, options) -> list[Difference]:
    with importable(peer_dir):
        modeling, processing, utils = load_peer(peer_dir)
        model = peer_model(modeling, utils)
        preprocess = processing.Preprocess(utils.Config(vg_config()))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "pytorch_model.bin"
            torch.save(model.state_dict(), path)  # as MMF's / HuggingFace's file holds it
            loaded = load_detector(path, rules="mmf")
        file_anchors = model.state_dict()[ANCHORS_KEY]
        order = anchor_order(path, file_anchors, NAMINGS["detectron2"]) or \
            list(range(len(file_anchors)))
        ours = BottomUpRegions(loaded.detector, min_boxes=MIN_BOXES, max_boxes=MAX_BOXES,
                               nms_thresh=NMS, top_attributes=1, loaded=loaded)
        rows = []
        for k, image in enumerate(drawn_images()):
            rows += compare_image(k, image, model, preprocess, ours, order)
    return rows
