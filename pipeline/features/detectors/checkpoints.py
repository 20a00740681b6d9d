"""The checkpoint namings the bottom-up detector loads, and what each conversion does.

Three namings hold the same network (Anderson et al.'s Caffe model, or one
trained here); each is converted into :class:`BottomUpDetector`'s own
state_dict, which follows the Caffe model's conventions:

``bua-caffe``
    MILVLG/bottom-up-attention.pytorch (``bua-caffe-frcn-r101_with_attributes.pth``,
    ``bua-caffe-frcn-r101_k10-100.pth``): detectron2 module names, Caffe's order
    kept: background is class 0, "no attribute" is attribute 0, the RPN's
    objectness has two channels per anchor (a background block, then a
    foreground block) and its anchors are Caffe's, ratio-major. The attribute
    layers are ``cls_embed`` (its first MILVLG release had one row too many,
    never read), ``attr_linear1``, ``attr_linear2``.
``detectron2``
    airsplay/py-bottom-up-attention's conversion, which LXMERT and mmf use
    (``faster_rcnn_from_caffe_attr.pkl``, a pickle of numpy arrays; or mmf's /
    HuggingFace's ``pytorch_model.bin``): detectron2's conventions. Background
    and "no attribute" are the last rows, one objectness logit per anchor,
    anchors size-major, ``bbox_pred`` has foreground rows only and is scaled
    by detectron2's box weights (10, 10, 5, 5); attribute layers
    ``cls_embedding``, ``fc_attr``, ``attr_score``.
``capstack``
    a detector trained here (``capstack train-detector``): the model's own
    state_dict with its :class:`DetectorConfig` and label names.

Conversions (all exact): the two objectness channels become one logit
(softmax over (b, f) picks f with probability sigmoid(f - b)); anchors are
reordered to Caffe's order, by matching the anchor boxes a checkpoint carries
(``proposal_generator.anchor_generator.cell_anchors.0``) or, without them, by
the naming's own order; background / "no attribute" rows move to the front;
``bbox_pred`` is unscaled and given zero background rows. Every key must
find its place and every place must be filled: anything else is refused,
naming the first offending keys as the file spells them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch import Tensor

from pipeline.core import safe_pickle
from pipeline.core.errors import CapstackError
from pipeline.core.hashing import md5_of_file
from pipeline.core.state_dicts import listed, require_fit, tensors_only
from pipeline.features.detectors.anchors import VG_RATIOS, VG_SCALES, cell_anchors
from pipeline.features.detectors.caffe_resnet import ResNetShape
from pipeline.features.detectors.detector import BottomUpDetector, DetectorConfig
from pipeline.features.detectors.rules import DEFAULT as DEFAULT_RULES

CAPSTACK_FORMAT = "capstack-bottom-up"
ANCHORS_KEY = "proposal_generator.anchor_generator.cell_anchors.0"
DETECTRON2_BOX_WEIGHTS = (10.0, 10.0, 5.0, 5.0)
# tensors whose row 0 is the background class (or "no attribute") in Caffe's order
BACKGROUND_ROWS = ("predictor.cls_score.weight", "predictor.cls_score.bias",
                   "attributes.class_embedding.weight", "attributes.attr_score.weight",
                   "attributes.attr_score.bias")
KNOWN_SOURCES = (
    "MILVLG/bottom-up-attention.pytorch: bua-caffe-frcn-r101_with_attributes.pth "
    "(naming bua-caffe)",
    "airsplay/py-bottom-up-attention: faster_rcnn_from_caffe_attr.pkl, or mmf's / "
    "HuggingFace unc-nlp/frcnn-vg-finetuned pytorch_model.bin (naming detectron2)",
)


@dataclass(frozen=True)
class Naming:
    name: str
    renames: tuple[tuple[str, str], ...]  # (file's prefix, model's prefix), first match wins
    background_last: bool  # cls_score and cls embedding rows, attr_score's "no attribute"
    objectness_pairs: bool  # two channels per anchor: a background block, a foreground block
    anchors_size_major: bool  # the anchor order when the file has no anchor boxes
    box_weights: tuple[float, ...] | None  # bbox_pred scaled by these, foreground rows only


_SHARED = (("backbone.", "backbone."), ("roi_heads.res5.", "box_head.res5."),
           ("proposal_generator.rpn_head.conv.", "rpn.conv."),
           ("proposal_generator.rpn_head.objectness_logits.", "rpn.objectness."),
           ("proposal_generator.rpn_head.anchor_deltas.", "rpn.deltas."),
           ("roi_heads.box_predictor.cls_score.", "predictor.cls_score."),
           ("roi_heads.box_predictor.bbox_pred.", "predictor.bbox_pred."))
NAMINGS = {
    "bua-caffe": Naming("bua-caffe", _SHARED + (
        ("roi_heads.box_predictor.cls_embed.", "attributes.class_embedding."),
        ("roi_heads.box_predictor.attr_linear1.", "attributes.fc."),
        ("roi_heads.box_predictor.attr_linear2.", "attributes.attr_score.")),
        background_last=False, objectness_pairs=True, anchors_size_major=False, box_weights=None),
    "detectron2": Naming("detectron2", _SHARED + (
        ("roi_heads.box_predictor.cls_embedding.", "attributes.class_embedding."),
        ("roi_heads.box_predictor.fc_attr.", "attributes.fc."),
        ("roi_heads.box_predictor.attr_score.", "attributes.attr_score.")),
        background_last=True, objectness_pairs=False, anchors_size_major=True,
        box_weights=DETECTRON2_BOX_WEIGHTS),
}
# the Visual Genome model's settings that no weight tells: the Caffe choices (DetectorConfig)
VG_RESNET = ResNetShape(stride_in_1x1=True, caffe_maxpool=True, res5_stride=1, res5_dilation=2)


@dataclass
class LoadedDetector:
    detector: BottomUpDetector
    naming: str
    path: str
    md5: str
    conversions: list[str] = field(default_factory=list)  # what was done to the file's tensors
    objects: list[str] | None = None  # label names a capstack checkpoint carries
    attributes: list[str] | None = None

    def about(self) -> dict:
        return {"checkpoint": self.path, "checkpoint_md5": self.md5, "naming": self.naming,
                "conversions": self.conversions}


# --------------------------------------------------------------------------- reading

def missing_checkpoint(path: Path) -> CapstackError:
    sources = "; ".join(KNOWN_SOURCES)
    return CapstackError(
        f"{path}: bottom-up detector checkpoint not found. Nothing is downloaded: get one of "
        f"{sources}; or train one with `capstack train-detector`. Put the file anywhere "
        f"(e.g. ~/.cache/capstack/detectors/) and pass its path with --weights")


def read_checkpoint(path: Path) -> dict:
    """The file's top-level object: a pickle of numpy arrays (.pkl) or a torch file."""
    if not path.is_file():
        raise missing_checkpoint(path)
    if path.suffix == ".pkl":
        with open(path, "rb") as f:
            return safe_pickle.load(f, str(path))  # arrays and plain containers only
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file
        raise CapstackError(f"{path}: cannot read a checkpoint ({type(e).__name__}: "
                            f"{str(e).splitlines()[0]})") from None


def tensors_of(path: Path, state) -> dict[str, Tensor]:
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    if not isinstance(state, dict) or not state:
        raise CapstackError(f"{path}: not a checkpoint (expected a dict of tensors, or one under "
                            f"'model')")
    return tensors_only({key: torch.from_numpy(np.ascontiguousarray(value))
                         if isinstance(value, np.ndarray) else value
                         for key, value in state.items()}, path)  # named as backbones name them


def detect_naming(path: Path, state: dict[str, Tensor]) -> Naming:
    for naming in NAMINGS.values():
        attribute_prefix = naming.renames[-1][0]
        if any(k.startswith(attribute_prefix) for k in state):
            return naming
    first = ", ".join(sorted(state)[:3])
    raise CapstackError(f"{path}: not a bottom-up detector checkpoint in a known naming "
                        f"({', '.join(NAMINGS)}, or capstack's own); first keys: {first}")


# --------------------------------------------------------------------------- converting

def renamed(path: Path, state: dict[str, Tensor], naming: Naming) -> dict[str, Tensor]:
    out = {}
    unknown = []
    for key, value in state.items():
        if key.endswith("num_batches_tracked") or key == ANCHORS_KEY:
            continue
        for theirs, ours in naming.renames:
            if key.startswith(theirs):
                out[ours + key[len(theirs):]] = value
                break
        else:
            unknown.append(key)
    if unknown:
        raise refusal(path, naming, "unexpected keys", unknown)
    return out


def refusal(path: Path, naming: Naming, problem: str, keys: list[str]) -> CapstackError:
    return CapstackError(f"{path}: does not fit the bottom-up detector (naming {naming.name}): "
                         f"{problem} {listed(keys)}")


def anchor_order(path: Path, anchors: Tensor | None, naming: Naming) -> list[int] | None:
    """For each Caffe anchor (ratio-major), the file's anchor row holding it; None: same order."""
    caffe = cell_anchors(16, VG_RATIOS, VG_SCALES)
    caffe_wh = torch.stack([caffe[:, 2] - caffe[:, 0] + 1, caffe[:, 3] - caffe[:, 1] + 1], 1)
    if anchors is None:
        if not naming.anchors_size_major:
            return None
        ratios, scales = len(VG_RATIOS), len(VG_SCALES)  # size-major: row s * ratios + r
        return [s * ratios + r for r in range(ratios) for s in range(scales)]
    anchors = anchors.double()
    if anchors.shape != caffe.shape:
        raise CapstackError(f"{path}: {ANCHORS_KEY} has shape {list(anchors.shape)}, the VG "
                            f"model has {len(caffe)} anchors (ratios {VG_RATIOS} x scales "
                            f"{VG_SCALES} x 16 px)")
    theirs = torch.stack([anchors[:, 2] - anchors[:, 0], anchors[:, 3] - anchors[:, 1]], 1)
    distance = (caffe_wh.log()[:, None] - theirs.clamp(min=1e-3).log()[None]).abs().amax(-1)
    best = distance.argmin(dim=1)
    if distance.min(dim=1).values.max() > 0.1 or len(set(best.tolist())) != len(caffe):
        raise CapstackError(f"{path}: its anchors ({ANCHORS_KEY}) are not the VG model's "
                            f"(ratios {VG_RATIOS}, 64 to 512 px): this RPN was trained for "
                            f"other anchors")
    order = best.tolist()
    return None if order == list(range(len(caffe))) else order


def reorder_anchors(state: dict[str, Tensor], order: list[int]) -> None:
    """Row k of the RPN's objectness (and delta group k) becomes the old row ``order[k]``."""
    for name in ("rpn.objectness.weight", "rpn.objectness.bias"):
        if name in state:
            state[name] = state[name][order]
    for name in ("rpn.deltas.weight", "rpn.deltas.bias"):
        if name in state:
            t = state[name]
            state[name] = t.reshape(-1, 4, *t.shape[1:])[order].reshape(t.shape)


def _rows_to_front(t: Tensor) -> Tensor:
    return torch.cat([t[-1:], t[:-1]])


def _rows_to_back(t: Tensor) -> Tensor:
    return torch.cat([t[1:], t[:1]])


def file_anchors(raw: dict[str, Tensor], order: list[int] | None) -> Tensor | None:
    """The anchors a file carries (``cell_anchors.0``), in the RPN's order once converted."""
    anchors = raw.get(ANCHORS_KEY)
    if anchors is None:
        return None
    return (anchors if order is None else anchors[order]).float()


def convert(path: Path, raw: dict[str, Tensor], naming: Naming
            ) -> tuple[dict, list[str], Tensor | None]:
    """The file's tensors in the model's names and conventions, what was done to them, and
    the anchors it carries (in the converted order; None without)."""
    state = renamed(path, raw, naming)
    done = []
    if naming.objectness_pairs:
        for name in ("rpn.objectness.weight", "rpn.objectness.bias"):
            if name in state:
                pairs = state[name]
                a = pairs.shape[0] // 2
                state[name] = pairs[a:] - pairs[:a]
        done.append("objectness: softmax over (background, foreground) channels -> one logit "
                    "(foreground - background)")
    order = anchor_order(path, raw.get(ANCHORS_KEY), naming)
    if order is not None:
        reorder_anchors(state, order)
        done.append(f"anchors reordered to Caffe's ratio-major order {order}")
    if naming.background_last:
        for name in BACKGROUND_ROWS:
            if name in state:
                state[name] = _rows_to_front(state[name])
        done.append("background class and 'no attribute' moved from the last row to row 0")
    if naming.box_weights is not None:
        for name in ("predictor.bbox_pred.weight", "predictor.bbox_pred.bias"):
            if name in state:
                t = state[name]
                weights = t.new_tensor(naming.box_weights).repeat(t.shape[0] // 4)
                t = t / weights.view(-1, *([1] * (t.dim() - 1)))
                state[name] = torch.cat([t.new_zeros(4, *t.shape[1:]), t])
        done.append(f"bbox_pred divided by detectron2's box weights {naming.box_weights}, "
                    f"zero rows added for the background")
    embedding, scores = (state.get("attributes.class_embedding.weight"),
                         state.get("predictor.cls_score.weight"))
    if embedding is not None and scores is not None and len(embedding) == len(scores) + 1:
        state["attributes.class_embedding.weight"] = embedding[:len(scores)]
        done.append(f"class embedding: {len(embedding)} rows, the last never read, dropped")
    return state, done, file_anchors(raw, order)


def vg_config(path: Path, naming: Naming, state: dict[str, Tensor]) -> DetectorConfig:
    """The VG model's settings, with the sizes the weights have."""
    def blocks(prefix: str) -> int:
        """Blocks 0, 1, ... present: keys of a block past a gap are then unexpected keys."""
        found = {int(m.group(1)) for k in state
                 if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
        return next(n for n in range(len(found) + 1) if n not in found)

    needed = ["backbone.stem.conv1.weight", "rpn.conv.weight", "rpn.objectness.weight",
              "predictor.cls_score.weight"]
    if any(k.startswith("attributes.") for k in state):  # an attribute head: all of it
        needed += ["attributes.class_embedding.weight", "attributes.fc.weight",
                   "attributes.attr_score.weight"]
    absent = [k for k in needed if k not in state]
    if absent:
        raise refusal(path, naming, "missing keys", [_theirs(naming)(k) for k in absent])
    stages = cast("tuple[int, int, int, int]",  # one count per prefix: four
                  tuple(blocks(p) for p in ("backbone.res2.", "backbone.res3.", "backbone.res4.",
                                            "box_head.res5.")))
    width = state["backbone.stem.conv1.weight"].shape[0]
    anchors = state["rpn.objectness.weight"].shape[0]
    if anchors != len(VG_RATIOS) * len(VG_SCALES):
        raise CapstackError(f"{path}: the RPN scores {anchors} anchors per cell; the VG model "
                            f"has {len(VG_RATIOS) * len(VG_SCALES)}")
    attr = state.get("attributes.attr_score.weight")
    embedding = state.get("attributes.class_embedding.weight")
    hidden = state.get("attributes.fc.weight")
    return DetectorConfig(
        resnet=replace(VG_RESNET, blocks=stages, width=width),
        num_classes=state["predictor.cls_score.weight"].shape[0],
        num_attributes=0 if attr is None else attr.shape[0],
        rpn_channels=state["rpn.conv.weight"].shape[0],
        attribute_embedding=256 if embedding is None else embedding.shape[1],
        attribute_hidden=512 if hidden is None else hidden.shape[0])


def check_fits(path: Path, naming: str, state: dict[str, Tensor], model: BottomUpDetector,
               spelled=lambda key: key) -> None:
    """Refuse, naming the first keys (as the file spells them), unless state fits model exactly."""
    require_fit(state, model, path, f"the bottom-up detector (naming {naming})", spelled=spelled)


def _theirs(naming: Naming):
    def spelled(key: str) -> str:
        for theirs, ours in naming.renames:
            if key.startswith(ours):
                return theirs + key[len(ours):]
        return key
    return spelled


# --------------------------------------------------------------------------- loading

def load_detector(path, *, min_size: int | None = None, max_size: int | None = None,
                  md5: str | None = None, rules: str = DEFAULT_RULES) -> LoadedDetector:
    """The detector a checkpoint file holds, in any known naming, ready for inference.

    ``min_size``/``max_size`` override the checkpoint's image sizes (VG: 600 / 1000);
    ``rules``: the reference whose test-time rules it follows (``caffe``, ``mmf``; the
    anchors a file carries are kept for the rules that use them). Every key is checked
    before anything is copied.
    """
    path = Path(path).expanduser().resolve()
    top = read_checkpoint(path)
    md5 = md5 or md5_of_file(path)
    conversions: list[str]
    if isinstance(top, dict) and top.get("format") == CAPSTACK_FORMAT:
        config = DetectorConfig.from_dict(top["config"])
        state, naming, conversions = tensors_of(path, top["model"]), "capstack", []
        spelled = lambda key: key  # noqa: E731
        objects, attributes = top.get("objects"), top.get("attributes")
        anchors = None
    else:
        raw = tensors_of(path, top)
        found = detect_naming(path, raw)
        state, conversions, anchors = convert(path, raw, found)
        config, naming, spelled = vg_config(path, found, state), found.name, _theirs(found)
        objects = attributes = None
    if min_size is not None:
        config = config.resized(min_size, max_size if max_size is not None else config.max_size)
    detector = BottomUpDetector(config, rules=rules, file_anchors=anchors)
    state = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    check_fits(path, naming, state, detector, spelled)
    detector.load_state_dict(state, strict=False)  # only num_batches_tracked may be left out
    return LoadedDetector(detector.eval(), naming, str(path), md5, conversions, objects, attributes)


# --------------------------------------------------------------------------- writing

def save_capstack(detector: BottomUpDetector, path: Path, *, objects: list[str] | None = None,
                  attributes: list[str] | None = None, about: dict | None = None) -> None:
    """A checkpoint in capstack's naming: state_dict (norm counters dropped), config, labels."""
    from pipeline.core.atomic import atomic_file

    state = {k: v.detach().cpu().clone() for k, v in detector.state_dict().items()
             if not k.endswith("num_batches_tracked")}
    with atomic_file(Path(path)) as tmp:
        torch.save({"format": CAPSTACK_FORMAT, "version": 1,
                    "config": detector.config.to_dict(), "model": state,
                    "objects": objects, "attributes": attributes, "about": about or {}}, tmp)


def in_naming(detector: BottomUpDetector, naming_name: str) -> dict[str, Tensor]:
    """The model's weights as a file of ``naming`` would hold them (the inverse of :func:`convert`).

    What the tests and ``benchmarks/vg_checkpoints.py`` write to stand in for the real files.
    """
    naming = NAMINGS[naming_name]
    state = {k: v.detach().cpu().clone() for k, v in detector.state_dict().items()
             if not k.endswith("num_batches_tracked")}
    if naming.box_weights is not None:
        for name in ("predictor.bbox_pred.weight", "predictor.bbox_pred.bias"):
            t = state[name][4:]
            weights = t.new_tensor(naming.box_weights).repeat(t.shape[0] // 4)
            state[name] = t * weights.view(-1, *([1] * (t.dim() - 1)))
    if naming.background_last:
        for name in BACKGROUND_ROWS:
            if name in state:
                state[name] = _rows_to_back(state[name])
    caffe = cell_anchors(16, VG_RATIOS, VG_SCALES).float()
    order = anchor_order(Path("-"), None, naming)
    anchors = caffe
    if order is not None:  # the file's row order[k] holds Caffe anchor k
        inverse = [order.index(j) for j in range(len(order))]
        reorder_anchors(state, inverse)
        anchors = caffe[inverse]
    if naming.objectness_pairs:
        for name in ("rpn.objectness.weight", "rpn.objectness.bias"):
            logit = state[name]
            state[name] = torch.cat([torch.zeros_like(logit), logit])  # background 0, fg logit
    out = {}
    for key, value in state.items():
        for theirs, ours in naming.renames:
            if key.startswith(ours):
                out[theirs + key[len(ours):]] = value
                break
    out[ANCHORS_KEY] = anchors
    return out
