"""ROUGE-L (Lin 2004): longest common subsequence F-measure, pycocoevalcap's."""

from __future__ import annotations

import numpy as np

from trainer.scoring.metrics import METRICS
from trainer.scoring.metrics.base import Metric, Texts


@METRICS.register("rouge-l")
class RougeL(Metric):
    """ROUGE-L: the longest common subsequence's F-measure (beta 1.2), pycocoevalcap's."""

    values = ("ROUGE-L",)
    columns = ("ROUGE-L",)
    keys = ("rouge_l",)
    place = 30

    def scored(self, texts: Texts) -> tuple[list[float], np.ndarray]:
        from pycocoevalcap.rouge.rouge import Rouge

        value, per_image = Rouge().compute_score(texts.references, texts.candidates)
        return [value], np.asarray(per_image, dtype=np.float64)[:, None]  # value: their mean
