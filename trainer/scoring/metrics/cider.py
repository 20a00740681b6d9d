"""CIDEr-D (Vedantam et al. 2015): TF-IDF n-gram consensus, pycocoevalcap's."""

from __future__ import annotations

from trainer.scoring.metrics import METRICS
from trainer.scoring.metrics.base import Metric, Texts


@METRICS.register("cider")
class Cider(Metric):
    """CIDEr-D with the document frequencies of the references scored (pycocoevalcap)."""

    values = ("CIDEr",)
    columns = ("CIDEr",)
    keys = ("cider",)
    place = 40

    def compute(self, texts: Texts) -> list[float]:
        from pycocoevalcap.cider.cider import Cider as Scorer

        return [Scorer().compute_score(texts.references, texts.candidates)[0]]
