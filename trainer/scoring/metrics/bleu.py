"""BLEU-1..4 (Papineni et al. 2002): corpus-level n-gram precision, pycocoevalcap's."""

from __future__ import annotations

from trainer.scoring.metrics import METRICS
from trainer.scoring.metrics.base import Metric, Texts


@METRICS.register("bleu")
class Bleu(Metric):
    """BLEU-1..4, corpus level, the closest reference length (pycocoevalcap)."""

    values = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4")
    columns = ("B@1", "B@2", "B@3", "B@4")
    keys = ("bleu1", "bleu2", "bleu3", "bleu4")
    place = 10

    def compute(self, texts: Texts) -> list[float]:
        from pycocoevalcap.bleu.bleu import Bleu as Scorer

        values, _ = Scorer(4).compute_score(texts.references, texts.candidates, verbose=0)
        return list(values)
