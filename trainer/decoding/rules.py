"""What a search applies to each step's log-probabilities: the length penalty that ranks a
beam's hypotheses, the blocking rules (no word twice in a row, no trigram twice, no bad
ending), and the filters a sample draws through (temperature, top-k, the nucleus)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from pipeline.core.errors import CapstackError, shown
from pipeline.core.tokens import EOS_ID
from trainer.decoding.words import tempered

# self-critical.pytorch's list (captioning/models/AttModel.py ``bad_endings``)
BAD_ENDINGS = ("a", "an", "the", "in", "for", "at", "of", "with", "before", "after", "on",
               "upon", "near", "to", "is", "are", "am")
# wu_ALPHA's largest ALPHA. GNMT tunes it within 0 to 1; at 10 a caption of 11 tokens already
# has its score divided by (16/15)^10 = 1.9 times more than one of 10. (5 + L)^ALPHA stays
# within float32 at the longest captions (MAX_CAPTION_WORDS + 1 tokens) up to ALPHA 12.8; past
# that it overflows, and every score is 0 or NaN (NaN ranks first: empty or cut captions)
MAX_WU_ALPHA = 10.0


@dataclass(frozen=True)
class LengthPenalty:
    """How beam search ranks hypotheses of L tokens (``<eos>`` included) with log-probability
    S: ``none`` S, ``wu`` S / ((5 + L)^alpha / 6^alpha) (GNMT), ``avg`` S / L (alpha unused,
    as the peer has it). Written ``none``, ``wu_ALPHA`` or ``avg_ALPHA`` (:meth:`parse`)."""

    kind: Literal["none", "wu", "avg"] = "none"
    alpha: float = 0.0

    @classmethod
    def parse(cls, text: str) -> "LengthPenalty":
        """``none`` | ``wu_ALPHA`` | ``avg_ALPHA``; ValueError says why not."""
        if text in ("none", ""):
            return cls()
        kind, sep, alpha = text.partition("_")
        if kind in ("wu", "avg") and sep:
            try:
                value = float(alpha)
            except ValueError:
                value = math.nan
            if kind == "wu" and value > MAX_WU_ALPHA:
                raise ValueError(f"wu_ALPHA takes ALPHA from 0 to {MAX_WU_ALPHA:g} (GNMT's is "
                                 f"within 0 to 1; above {MAX_WU_ALPHA:g}, (5 + L)^ALPHA leaves "
                                 f"float32), got {shown(text)}")
            if math.isfinite(value) and value >= 0:
                return cls("wu" if kind == "wu" else "avg", value)
        raise ValueError(f"expected none, wu_ALPHA or avg_ALPHA (ALPHA a number, 0 or more), "
                         f"got {shown(text)}")

    def __call__(self, scores: Tensor, lengths: Tensor) -> Tensor:
        return length_penalized(self.kind, self.alpha, scores, lengths)


NO_PENALTY = LengthPenalty()


def parse_length_penalty(text: str) -> tuple[str, float]:
    """``none`` | ``wu_ALPHA`` | ``avg_ALPHA`` -> (kind, alpha); ValueError says why not."""
    penalty = LengthPenalty.parse(text)
    return penalty.kind, penalty.alpha


def length_penalized(kind: str, alpha: float, scores: Tensor, lengths: Tensor) -> Tensor:
    """Scores S of hypotheses of L tokens (``<eos>`` included) as beam search ranks them: wu
    S / ((5 + L)^alpha / 6^alpha); avg S / L; none S."""
    if kind == "wu":
        return scores / ((5 + lengths.to(scores.dtype)) ** alpha / 6 ** alpha)
    if kind == "avg":
        return scores / lengths.to(scores.dtype).clamp(min=1)
    return scores


@dataclass(frozen=True)
class Blocking:
    """What no caption may hold: a word twice in a row, a trigram twice, a bad ending (None:
    bad endings allowed)."""

    no_repeats: bool = False
    trigrams: bool = False
    bad_endings: tuple[str, ...] | None = None

    @property
    def any(self) -> bool:
        return self.no_repeats or self.trigrams or self.bad_endings is not None

    def rules(self, vocab, max_len: int) -> "Rules":
        """These rules resolved against a vocabulary's ids."""
        bad = None
        if self.bad_endings is not None:
            if vocab is None:
                raise CapstackError("remove_bad_endings: the vocabulary is needed to know the "
                                    "bad endings' ids")
            bad = torch.tensor(sorted({vocab.wtoi[w] for w in self.bad_endings
                                       if w in vocab.wtoi}), dtype=torch.long)
        return Rules(max_len, self.no_repeats, self.trigrams, bad)


@dataclass(frozen=True)
class Rules:
    """What every step forbids: :class:`Blocking` resolved against a vocabulary."""

    max_len: int
    no_repeats: bool = False
    block_trigrams: bool = False
    bad: Tensor | None = None  # ids of the bad endings, or None

    @property
    def any(self) -> bool:
        return self.no_repeats or self.block_trigrams or self.bad is not None

    def apply(self, logp: Tensor, history: Tensor, t: int, full: Tensor) -> Tensor:
        """``logp`` [N, V] with what may not follow ``history`` [N, t] at step t set to -inf.

        A row left without any word (a small vocabulary) may end: ``<eos>`` at the model's
        log-probability ``full``."""
        if not self.any:
            return logp
        blocked = torch.zeros_like(logp, dtype=torch.bool)
        if self.no_repeats and t >= 1:
            blocked.scatter_(1, history[:, t - 1:t], True)
        if self.block_trigrams and t >= 3:
            same = (history[:, :t - 2] == history[:, t - 2:t - 1]) & \
                (history[:, 1:t - 1] == history[:, t - 1:t])  # [N, t-2]: an earlier pair
            counts = torch.zeros(logp.shape, dtype=torch.long, device=logp.device)
            counts.scatter_add_(1, history[:, 2:t], same.long())  # its third word
            blocked |= counts > 0
        if self.bad is not None:
            bad = self.bad.to(logp.device)
            if t >= 1:
                blocked[:, EOS_ID] |= torch.isin(history[:, t - 1], bad)
            if t == self.max_len - 1:  # the last word before the forced <eos>
                blocked[:, bad] = True
        logp = logp.masked_fill(blocked, float("-inf"))
        stuck = ~torch.isfinite(logp).any(1)
        if stuck.any():
            logp[stuck, EOS_ID] = full[stuck, EOS_ID]
        return logp


def filtered(logp: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """The log-weights a sample draws from: log p / temperature, the ``top_k`` best words
    (0: all), then the nucleus: the fewest most probable words whose probability (the
    tempered distribution's, renormalised) reaches ``top_p``, the most probable word always
    (a ``top_p`` below float32's smallest number reads as 0, which every word reaches); the
    others -inf. A temperature too small for float32 is its limit: the most probable word
    (:func:`~trainer.decoding.words.tempered`)."""
    logp = tempered(logp, temperature)
    if top_k and top_k < logp.shape[1]:
        kth = logp.topk(top_k, dim=1).values[:, -1:]
        logp = logp.masked_fill(logp < kth, float("-inf"))
    if top_p < 1:
        probs = torch.softmax(logp, 1)
        sorted_probs, order = probs.sort(1, descending=True)
        before = sorted_probs.cumsum(1) - sorted_probs  # probability of the better words
        drop_sorted = before >= top_p  # the nucleus reached without this word
        drop_sorted[:, 0] = False  # the most probable word: the nucleus is never empty
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
        logp = logp.masked_fill(drop, float("-inf"))
    return logp
