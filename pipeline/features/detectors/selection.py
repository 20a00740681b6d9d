"""Which proposals become regions: the rule of bottom-up's ``generate_tsv.py``.

Per class, NMS over the proposals' scores; a proposal's confidence is its best
score among the classes it survives; kept: those of at least ``conf_thresh``,
at least ``min_boxes`` and at most ``max_boxes`` of them, best first.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.ops import box_iou
from torchvision.ops.boxes import _batched_nms_vanilla


class RegionExtractor(nn.Module):
    """A detector with the selection rule's settings: what every region extractor shares.

    Always in eval mode (RPNs and box heads need it at inference), whatever
    ``train()`` is asked. Subclasses set ``feature_dim`` and ``layer`` (the store's
    metadata) and return per image a dict of ``features``, ``boxes``, ``scores``,
    ``classes`` (and any other field they declare).
    """

    def __init__(self, detector: nn.Module, *, min_boxes: int, max_boxes: int,
                 conf_thresh: float, nms_thresh: float):
        super().__init__()
        if not 0 <= min_boxes <= max_boxes:
            raise ValueError(f"need 0 <= min_boxes <= max_boxes, got {min_boxes}, {max_boxes}")
        self.detector = detector.eval()
        self.min_boxes, self.max_boxes = min_boxes, max_boxes
        self.conf_thresh, self.nms_thresh = conf_thresh, nms_thresh

    def train(self, mode: bool = True) -> RegionExtractor:
        """An extractor never trains: stays in eval mode whatever ``mode`` says."""
        return super().train(False)

    def select(self, boxes: Tensor, class_scores: Tensor) -> tuple[Tensor, Tensor]:
        """:func:`select_regions` with this extractor's settings."""
        return select_regions(boxes, class_scores, nms_thresh=self.nms_thresh,
                              conf_thresh=self.conf_thresh, min_boxes=self.min_boxes,
                              max_boxes=self.max_boxes)


def survived_max_score(boxes: Tensor, class_scores: Tensor, nms_thresh: float,
                       min_score: float = 0.0) -> Tensor:
    """Per box, its best score over the classes for which it survives per-class NMS (0 if none).

    Only (box, class) entries scoring ``>= min_score`` take part. That is exact for
    every result ``>= min_score`` (an entry is only ever suppressed by higher
    scores) and much cheaper with many classes; lower results read 0.
    boxes [N, 4], class_scores [N, K] (foreground classes only) -> [N].

    Every class at once: all classes rank the same N boxes, so one IoU matrix serves
    them all, and NMS walks every class's ranking in step, a rank at a time (at most
    N steps, none per class). Each decision is the one torchvision's ``nms`` makes
    per class: its IoU in float32 (``box_iou`` does the kernel's operations in its
    order), above the threshold in float64 (the kernel's comparison), equal scores
    ranked lower box first (its stable sort).
    """
    n = class_scores.shape[0]
    taking_part = class_scores >= min_score  # [N, K]
    columns = class_scores.t()[taking_part.any(dim=0)]  # [C, N]: the classes with an entry
    scores, order = columns.sort(dim=1, descending=True, stable=True)  # [C, N] best first
    steps = int(taking_part.sum(dim=0).max()) if taking_part.numel() else 0
    scores, order = scores[:, :steps], order[:, :steps]  # [C, R]: order[c, r] is c's r-th box
    entries = scores >= min_score  # [C, R]
    suppresses = box_iou(boxes, boxes).double() > nms_thresh  # [N, N], symmetric
    suppressed = torch.zeros_like(columns, dtype=torch.bool)  # [C, N]
    kept = torch.zeros_like(entries)  # [C, R]
    for rank in range(steps):
        box = order[:, rank]  # [C]
        kept[:, rank] = entries[:, rank] & ~suppressed.gather(1, box[:, None])[:, 0]
        suppressed |= suppresses[box] & kept[:, rank, None]  # [C, N]
    best = class_scores.new_zeros(n)
    return best.scatter_reduce(0, order.flatten(), torch.where(kept, scores, 0).flatten(),
                               reduce="amax")  # [N]


def fill_up_floor(class_scores: Tensor, need: int) -> Tensor:
    """A score that at least ``need`` boxes' survived scores reach (0 when none is known).

    A class's best box always survives NMS for it (the first in its ranking: the
    lowest index among equal scores), so it reaches that score; the ``need``-th best
    of those guarantees. class_scores [N, K] -> a 0-d tensor.
    """
    n = class_scores.shape[0]
    best = class_scores.max(dim=0).values  # [K]
    rows = torch.arange(n, device=class_scores.device)[:, None]  # [N, 1]
    first = torch.where(class_scores == best, rows, n).amin(dim=0)  # [K]
    reached = class_scores.new_zeros(n).scatter_reduce(0, first, best, reduce="amax")  # [N]
    return reached.topk(need).values[-1] if need else reached.new_zeros(())


def select_regions(boxes: Tensor, class_scores: Tensor, *, nms_thresh: float, conf_thresh: float,
                   min_boxes: int, max_boxes: int) -> tuple[Tensor, Tensor]:
    """The bottom-up rule: which of N proposals to keep, best first, and their scores.

    A proposal's score is its best class score among the classes for which it
    survives per-class NMS (:func:`survived_max_score`). Kept: those scoring
    ``>= conf_thresh``; if fewer than ``min_boxes``, the ``min_boxes`` best anyway;
    at most ``max_boxes``; never more than exist. Ties (such as proposals suppressed
    for every class, score 0) go to the higher raw class score.

    The fill-up ranks only the entries that can reach its ``min_boxes`` best: those
    scoring at least :func:`fill_up_floor` (all of them when that is 0). The scores
    it keeps are exact (:func:`survived_max_score`), and every box left out scores
    below each of them.

    boxes [N, 4], class_scores [N, K] (foreground) -> indices [M], scores [M].
    """
    if boxes.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64, device=boxes.device), class_scores.new_zeros(0)
    conf = survived_max_score(boxes, class_scores, nms_thresh, min_score=conf_thresh)  # [N]
    count = int((conf >= conf_thresh).sum())
    if count < min_boxes and conf_thresh > 0:  # the fill-up ranks the rest too
        floor = float(fill_up_floor(class_scores, min(min_boxes, len(conf))))
        conf = survived_max_score(boxes, class_scores, nms_thresh, min_score=floor)
    # sort by raw max score, then stably by conf: conf decides, raw score breaks ties
    order = class_scores.max(dim=1).values.argsort(descending=True, stable=True)
    order = order[conf[order].argsort(descending=True, stable=True)]
    count = min(max(count, min_boxes), max_boxes, len(order))
    keep = order[:count]
    return keep, conf[keep]


def _per_class_select_regions(boxes: Tensor, class_scores: Tensor, *, nms_thresh: float,
                              conf_thresh: float, min_boxes: int,
                              max_boxes: int) -> tuple[Tensor, Tensor]:
    """:func:`select_regions` as it was: one ``nms`` per class in a Python loop, the fill-up
    over every entry. The reference the tests and ``benchmarks/region_selection.py``
    hold it to; nothing else calls it."""

    def survived(min_score: float) -> Tensor:
        box_index, class_index = torch.nonzero(class_scores >= min_score, as_tuple=True)
        entry_scores = class_scores[box_index, class_index]  # [E]
        keep = _batched_nms_vanilla(boxes[box_index], entry_scores, class_index, nms_thresh)
        best = class_scores.new_zeros(len(boxes))
        return best.scatter_reduce(0, box_index[keep], entry_scores[keep], reduce="amax")

    if boxes.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64, device=boxes.device), class_scores.new_zeros(0)
    conf = survived(conf_thresh)
    count = int((conf >= conf_thresh).sum())
    if count < min_boxes and conf_thresh > 0:
        conf = survived(0.0)
    order = class_scores.max(dim=1).values.argsort(descending=True, stable=True)
    order = order[conf[order].argsort(descending=True, stable=True)]
    count = min(max(count, min_boxes), max_boxes, len(order))
    keep = order[:count]
    return keep, conf[keep]
