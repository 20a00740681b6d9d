"""CIDEr-D (Vedantam et al. 2015): TF-IDF n-gram consensus, pycocoevalcap's."""

from __future__ import annotations

import numpy as np

from trainer.scoring.metrics import METRICS
from trainer.scoring.metrics.base import Metric, Texts


@METRICS.register("cider")
class Cider(Metric):
    """CIDEr-D with the document frequencies of the references scored (pycocoevalcap)."""

    values = ("CIDEr",)
    columns = ("CIDEr",)
    keys = ("cider",)
    place = 40

    def scored(self, texts: Texts) -> tuple[list[float], np.ndarray]:
        from pycocoevalcap.cider.cider import Cider as Scorer

        value, per_image = Scorer().compute_score(texts.references, texts.candidates)
        return [value], np.asarray(per_image, dtype=np.float64)[:, None]  # value: their mean
