"""Which proposals become regions: the rule of bottom-up's ``generate_tsv.py``.

Per class, NMS over the proposals' scores; a proposal's confidence is its best
score among the classes it survives; kept: those of at least ``conf_thresh``,
at least ``min_boxes`` and at most ``max_boxes`` of them, best first.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.ops import batched_nms


def survived_max_score(boxes: Tensor, class_scores: Tensor, nms_thresh: float,
                       min_score: float = 0.0) -> Tensor:
    """Per box, its best score over the classes for which it survives per-class NMS (0 if none).

    Only (box, class) entries scoring ``>= min_score`` take part. That is exact for
    every result ``>= min_score`` (an entry is only ever suppressed by higher
    scores) and much cheaper with many classes; lower results read 0.
    boxes [N, 4], class_scores [N, K] (foreground classes only) -> [N].
    """
    n, k = class_scores.shape
    box_index, class_index = torch.nonzero(class_scores >= min_score, as_tuple=True)  # [E], [E]
    entry_scores = class_scores[box_index, class_index]  # [E]
    keep = batched_nms(boxes[box_index], entry_scores, class_index, nms_thresh)  # [E'] into E
    best = class_scores.new_zeros(n)
    return best.scatter_reduce(0, box_index[keep], entry_scores[keep], reduce="amax")  # [N]


def select_regions(boxes: Tensor, class_scores: Tensor, *, nms_thresh: float, conf_thresh: float,
                   min_boxes: int, max_boxes: int) -> tuple[Tensor, Tensor]:
    """The bottom-up rule: which of N proposals to keep, best first, and their scores.

    A proposal's score is its best class score among the classes for which it
    survives per-class NMS (:func:`survived_max_score`). Kept: those scoring
    ``>= conf_thresh``; if fewer than ``min_boxes``, the ``min_boxes`` best anyway;
    at most ``max_boxes``; never more than exist. Ties (such as proposals suppressed
    for every class, score 0) go to the higher raw class score.

    boxes [N, 4], class_scores [N, K] (foreground) -> indices [M], scores [M].
    """
    if boxes.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64, device=boxes.device), class_scores.new_zeros(0)
    conf = survived_max_score(boxes, class_scores, nms_thresh, min_score=conf_thresh)  # [N]
    count = int((conf >= conf_thresh).sum())
    if count < min_boxes and conf_thresh > 0:  # the fill-up ranks the rest too: all entries
        conf = survived_max_score(boxes, class_scores, nms_thresh)
    # sort by raw max score, then stably by conf: conf decides, raw score breaks ties
    order = class_scores.max(dim=1).values.argsort(descending=True, stable=True)
    order = order[conf[order].argsort(descending=True, stable=True)]
    count = min(max(count, min_boxes), max_boxes, len(order))
    keep = order[:count]
    return keep, conf[keep]
