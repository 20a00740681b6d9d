"""BLEU-n of token-id captions, vectorised with numpy: pycocoevalcap's per-image BLEU.

pycocoevalcap's ``Bleu(4).compute_score`` returns the corpus BLEU and, per
order, a list of per-image scores; this is that per-image list's BLEU-n, with
its arithmetic (``bleu_scorer.py``): per order k <= n the clipped matches
(each n-gram's count at most its largest count in one reference) plus 1e-15,
over the candidate's n-grams plus 1e-9, multiplied up in order, to the power
1/n; the reference length is the *closest* one (ties: the shorter); and a
candidate shorter than it is penalised by ``exp(1 - 1/ratio)``, ratio
``(len + 1e-15) / (ref_len + 1e-9)``. An empty caption scores 0.

The references' largest counts are computed once, at build; a batch only counts
its candidates' n-grams (the keys of trainer/rewards/cider.py) and looks them up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.core.errors import CapstackError
from trainer.bounds import bounded
from trainer.rewards import REWARDS
from trainer.rewards.base import ReferenceReward
from trainer.rewards.cider import MAX_BASE, MAX_N, ngram_counts

TINY, SMALL = 1e-15, 1e-9  # pycocoevalcap's: a zero match count still gives a positive score
FAR = 1 << 30  # the length difference of a missing reference (no real one is this far)
NONE = np.iinfo(np.int64).max  # a key past every real one


@dataclass
class BleuConfig:
    n: int = bounded(4, 1, MAX_N)  # BLEU-n: the orders 1..n


@REWARDS.register("bleu")
class Bleu(ReferenceReward):
    """BLEU-n (pycocoevalcap's per-image score) against the train references."""

    Config = BleuConfig
    label = "BLEU"

    def prepare(self) -> None:
        r = self.references
        self.base = 1 << max(len(r.words) - 1, 1).bit_length()
        if self.base > MAX_BASE:
            raise CapstackError(f"BLEU: {len(r.words)} distinct words in the references; the "
                                f"n-gram keys hold at most {MAX_BASE}")
        rows, keys, counts = ngram_counts(r.tokens, r.lengths, self.base)
        image_of = np.repeat(np.arange(len(r.image_ids)), np.diff(r.start))[rows]
        ngrams, index = np.unique(keys, return_inverse=True)
        self.ngrams = np.append(ngrams, NONE)  # [G] (a last key no n-gram has: never empty)
        pairs, pair = np.unique(image_of * len(self.ngrams) + index, return_inverse=True)
        self.pairs = np.append(pairs, NONE)  # [P] image index * G + n-gram index, sorted
        self.max_counts = np.zeros(len(self.pairs))  # [P] its largest count in one reference
        np.maximum.at(self.max_counts, pair, counts)
        per_image = np.diff(r.start)
        slots = np.arange(per_image.max())[None, :] < per_image[:, None]
        self.ref_lengths = np.full(slots.shape, -FAR, np.int64)  # [I, Rmax]
        self.ref_lengths[slots] = r.lengths

    def score(self, image_ids, tokens, lengths) -> np.ndarray:
        tokens, lengths = np.asarray(tokens), np.asarray(lengths, np.int64)
        images = self.references.images(image_ids, self.label)
        m, n = len(tokens), self.config.n
        if m == 0:
            return np.zeros(0)
        rows, keys, counts = ngram_counts(tokens, lengths, self.base)
        index = np.minimum(np.searchsorted(self.ngrams, keys), len(self.ngrams) - 1)
        pair = images[rows] * len(self.ngrams) + index
        at = np.minimum(np.searchsorted(self.pairs, pair), len(self.pairs) - 1)
        seen = (self.ngrams[index] == keys) & (self.pairs[at] == pair)
        clipped = np.where(seen, np.minimum(counts, self.max_counts[at]), 0.0)
        order = keys % MAX_N
        correct = np.bincount(rows * MAX_N + order, weights=clipped,
                              minlength=m * MAX_N).reshape(m, MAX_N)
        guess = np.maximum(lengths[:, None] - np.arange(MAX_N), 0)  # n-grams of each order
        bleu = np.ones(m)
        for k in range(n):
            bleu = bleu * ((correct[:, k] + TINY) / (guess[:, k] + SMALL))
        bleu = bleu ** (1.0 / n)
        ref_lengths = self.ref_lengths[images]  # [B, Rmax]
        distance = np.abs(ref_lengths - lengths[:, None])
        closest = np.take_along_axis(
            ref_lengths, np.argmin(distance * (2 * FAR) + ref_lengths, 1)[:, None], 1)[:, 0]
        ratio = (lengths + TINY) / (closest + SMALL)
        with np.errstate(divide="ignore", over="ignore"):
            penalty = np.exp(1 - 1 / ratio)
        return np.where(ratio < 1, bleu * penalty, bleu)
