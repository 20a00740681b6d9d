"""Which proposals become regions: the rule of bottom-up's ``generate_tsv.py``.

Per class, NMS over the proposals' scores; a proposal's confidence is its best
score among the classes it survives; kept: those of at least ``conf_thresh``,
at least ``min_boxes`` and at most ``max_boxes`` of them, best first.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchvision.ops import batched_nms


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
