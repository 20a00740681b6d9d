"""BLEU-1..4 (Papineni et al. 2002): corpus-level n-gram precision, pycocoevalcap's.

Its per-image statistics are BLEU's sufficient statistics, as pycocoevalcap's scorer cooks
them: the caption's length, its closest reference length, and per order n the n-grams
guessed and matched. Summed over any set of images they give that set's corpus BLEU by
pycocoevalcap's formula (:meth:`Bleu.aggregate`), so a bootstrap resample costs no rescoring.
"""

from __future__ import annotations

import numpy as np

from trainer.scoring.metrics import METRICS
from trainer.scoring.metrics.base import Metric, Texts

ORDERS = 4
TINY, SMALL = 1e-15, 1e-9  # pycocoevalcap's: a zero match count still gives a positive score


@METRICS.register("bleu")
class Bleu(Metric):
    """BLEU-1..4, corpus level, the closest reference length (pycocoevalcap)."""

    values = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4")
    columns = ("B@1", "B@2", "B@3", "B@4")
    keys = ("bleu1", "bleu2", "bleu3", "bleu4")
    place = 10

    def scored(self, texts: Texts) -> tuple[list[float], np.ndarray]:
        """pycocoevalcap's values (its Bleu.compute_score, one scorer), and per image
        [testlen, reflen, guess_1..4, correct_1..4]."""
        from pycocoevalcap.bleu.bleu_scorer import BleuScorer

        scorer = BleuScorer(n=ORDERS)
        for image_id in texts.references:
            scorer += (texts.candidates[image_id][0], texts.references[image_id])
        values, _ = scorer.compute_score(option="closest", verbose=0)
        rows = [[c["testlen"], scorer._single_reflen(c["reflen"], "closest", c["testlen"]),
                 *c["guess"], *c["correct"]] for c in scorer.ctest]
        return list(values), np.asarray(rows, dtype=np.float64).reshape(-1, 2 + 2 * ORDERS)

    @property
    def width(self) -> int:
        """testlen, reflen, guess_1..4, correct_1..4."""
        return 2 + 2 * ORDERS

    def aggregate(self, totals: np.ndarray, images: int) -> np.ndarray:
        """pycocoevalcap's corpus BLEU-1..4 from the summed statistics."""
        testlen, reflen = totals[..., 0], totals[..., 1]
        guess, correct = totals[..., 2:2 + ORDERS], totals[..., 2 + ORDERS:]
        precisions = np.cumprod((correct + TINY) / (guess + SMALL), axis=-1)
        bleus = precisions ** (1.0 / np.arange(1, ORDERS + 1))
        ratio = (testlen + TINY) / (reflen + SMALL)
        penalty = np.where(ratio < 1, np.exp(1 - 1 / np.minimum(ratio, 1)), 1.0)
        return bleus * penalty[..., None]
