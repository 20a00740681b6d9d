"""ROUGE-L (Lin 2004): longest common subsequence F-measure, pycocoevalcap's."""

from __future__ import annotations

from trainer.scoring.metrics import METRICS
from trainer.scoring.metrics.base import Metric, Texts


@METRICS.register("rouge-l")
class RougeL(Metric):
    """ROUGE-L: the longest common subsequence's F-measure (beta 1.2), pycocoevalcap's."""

    values = ("ROUGE-L",)
    columns = ("ROUGE-L",)
    keys = ("rouge_l",)
    place = 30

    def compute(self, texts: Texts) -> list[float]:
        from pycocoevalcap.rouge.rouge import Rouge

        return [Rouge().compute_score(texts.references, texts.candidates)[0]]
