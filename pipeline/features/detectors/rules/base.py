"""What a reference implementation decides around the bottom-up network at test time."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class Selection:
    """How many regions an image keeps and by which thresholds (extract-regions' options)."""

    min_boxes: int
    max_boxes: int
    conf_thresh: float
    nms_thresh: float
    top_attributes: int


class DetectorRules:
    """One reference's test-time rules. The network's own parts (trunk, RPN head, box head,
    predictors) are shared; these say what is done between them.

    ``scale`` is whatever :meth:`network_input` returns for an image and is handed back
    to the other methods for it: a rule set may scale both sides alike or each apart.
    """

    name: str

    def network_input(self, image: Tensor, config) -> tuple[Tensor, float | Tensor]:
        """RGB floats 0..1 [3, H, W] -> the network's input [3, h, w] and its scale."""
        raise NotImplementedError

    def cell_anchors(self, proposals, file_anchors: Tensor | None) -> Tensor:
        """The anchors of the cell at the origin, [A, 4], in the RPN's channel order.

        ``proposals``: the detector's :class:`ProposalSettings`; ``file_anchors``: those a
        checkpoint carried, reordered to the RPN's channels (None when it had none).
        """
        raise NotImplementedError

    def proposals(self, generator, objectness: Tensor, deltas: Tensor,
                  image_size: tuple[int, int], scale) -> Tensor:
        """One image's proposals [P, 4] in the network input's pixels, best first.

        ``generator``: the detector's :class:`ProposalGenerator` (its settings and anchors);
        objectness [A, h, w] and deltas [4A, h, w] from the RPN head.
        """
        raise NotImplementedError

    def to_input(self, boxes: Tensor, scale) -> Tensor:
        """Boxes in the original image's pixels -> the network input's."""
        raise NotImplementedError

    def to_original(self, boxes: Tensor, scale) -> Tensor:
        """Boxes in the network input's pixels -> the original image's."""
        raise NotImplementedError

    def regions(self, found, selection: Selection) -> dict[str, Tensor]:
        """The regions an image keeps of its described proposals (:class:`Detections`):
        ``keep`` [N] (rows of ``found``), ``boxes`` [N, 4] original pixels, ``scores``,
        ``classes`` (1..K-1) and, when asked, ``attributes`` / ``attribute_scores``."""
        raise NotImplementedError
