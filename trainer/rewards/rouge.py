"""ROUGE-L of token-id captions, vectorised with numpy: pycocoevalcap's per-image ROUGE-L.

As pycocoevalcap's ``Rouge`` (``rouge.py``): the longest common subsequence
with each reference, precision ``lcs / len(candidate)`` and recall
``lcs / len(reference)``, each maximised over the references *separately*, then
``(1 + b^2) p r / (r + b^2 p)`` with beta 1.2 (0 when either is 0). Words are
``split(" ")``, so an empty caption is one empty word: it matches an empty
reference (an lcs of 1) and nothing else.

The LCS runs for a whole batch at once, every (candidate, reference) pair
together, one reference word at a time. Candidates of up to 64 words go
bit-parallel (Hyyro's bit-vector LCS: one uint64 per pair, a bit per candidate
word, ``V = (V + (V & M)) | (V - (V & M))`` per reference word with M the
candidate positions of that word; the LCS is the number of zero bits). Longer
ones take the dynamic programme row by row: the next row is the running maximum
of ``max(prev[j], prev[j-1] + 1 where the words match)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainer.rewards import REWARDS
from trainer.rewards.base import ReferenceReward

BETA = 1.2
EMPTY, REF_PAD, CAND_PAD = -1, -2, -3  # the empty word; padding that matches nothing
EMPTY_ID_FLOOR = CAND_PAD  # the lowest id a word or a padding takes


@dataclass
class RougeLConfig:
    pass  # pycocoevalcap's beta (1.2) is the metric's


@REWARDS.register("rouge-l")
class RougeL(ReferenceReward):
    """ROUGE-L (pycocoevalcap's, beta 1.2) against the train references."""

    Config = RougeLConfig
    label = "ROUGE-L"

    def prepare(self) -> None:
        r = self.references
        self.ref_tokens, self.ref_lengths = as_split(r.tokens, r.lengths, REF_PAD)

    def score(self, image_ids, tokens, lengths) -> np.ndarray:
        r = self.references
        images = r.images(image_ids, self.label)
        if len(images) == 0:
            return np.zeros(0)
        cand, cand_lengths = as_split(np.asarray(tokens), np.asarray(lengths, np.int64), CAND_PAD)
        count = np.diff(r.start)[images]  # references per candidate
        real = np.arange(count.max())[None, :] < count[:, None]  # [B, Rmax]
        slots = np.where(real, r.start[images][:, None] + np.arange(count.max()),
                         r.start[images][:, None])
        ref_lengths = self.ref_lengths[slots]  # [B, Rmax]
        refs = self.ref_tokens[slots][:, :, :ref_lengths.max()]  # [B, Rmax, L]
        common = (lcs_bits if cand.shape[1] <= 64 else lcs_rows)(cand, cand_lengths, refs)
        precision = np.where(real, common / cand_lengths[:, None], 0.0).max(1)
        recall = np.where(real, common / ref_lengths, 0.0).max(1)
        found = (precision != 0) & (recall != 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            score = ((1 + BETA ** 2) * precision * recall) / (recall + BETA ** 2 * precision)
        return np.where(found, score, 0.0)


def lcs_bits(cand: np.ndarray, cand_lengths: np.ndarray, refs: np.ndarray) -> np.ndarray:
    """[B, R] LCS lengths of candidates [B, T <= 64] with their references [B, R, L],
    bit-parallel: bit j of a pair's word stands for candidate word j."""
    b, t = cand.shape
    valid = np.arange(t)[None, :] < cand_lengths[:, None]
    stride = int(max(cand.max(), refs.max())) + 1 - EMPTY_ID_FLOOR
    keys = (np.arange(b)[:, None] * stride + cand - EMPTY_ID_FLOOR)[valid]  # (candidate, word)
    positions = np.broadcast_to(np.arange(t, dtype=np.uint64), (b, t))[valid]
    bits = np.left_shift(np.uint64(1), positions)
    order = np.argsort(keys, kind="stable")
    table, first = np.unique(keys[order], return_index=True)
    masks = np.bitwise_or.reduceat(bits[order], first)  # each word's positions in its candidate
    query = np.arange(b)[:, None, None] * stride + refs - EMPTY_ID_FLOOR  # [B, R, L]
    at = np.minimum(np.searchsorted(table, query), len(table) - 1)
    match = np.where(table[at] == query, masks[at], np.uint64(0))
    v = np.full(refs.shape[:2], ~np.uint64(0))
    for i in range(refs.shape[2]):
        u = v & match[:, :, i]
        v = (v + u) | (v - u)
    low = np.where(cand_lengths >= 64, ~np.uint64(0),
                   np.left_shift(np.uint64(1), np.minimum(cand_lengths, 63).astype(np.uint64))
                   - np.uint64(1))
    zeros = ~v & low[:, None]  # [B, R] one bit per word of the LCS
    return np.unpackbits(zeros.reshape(-1, 1).view(np.uint8), axis=1).sum(1).reshape(
        zeros.shape).astype(np.int64)


def lcs_rows(cand: np.ndarray, cand_lengths: np.ndarray, refs: np.ndarray) -> np.ndarray:
    """[B, R] LCS lengths, by the dynamic programme a reference word at a time (any length)."""
    lcs = np.zeros(refs.shape[:2] + (cand.shape[1] + 1,), np.int32)  # [B, R, T + 1]
    for i in range(refs.shape[2]):
        match = refs[:, :, i, None] == cand[:, None, :]  # [B, R, T]
        grown = np.maximum(lcs[:, :, 1:], np.where(match, lcs[:, :, :-1] + 1, 0))
        lcs[:, :, 1:] = np.maximum.accumulate(grown, axis=2)
    return np.take_along_axis(lcs, np.broadcast_to(
        cand_lengths[:, None, None], lcs.shape[:2] + (1,)), 2)[:, :, 0].astype(np.int64)


def as_split(tokens: np.ndarray, lengths: np.ndarray, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Word ids [N, T] as ``str.split(" ")`` gives them: an empty caption is one empty word;
    ``pad`` past each caption's words."""
    if tokens.shape[1] == 0:
        tokens = np.zeros((len(tokens), 1), np.int64)
    tokens = np.where(np.arange(tokens.shape[1])[None, :] < lengths[:, None], tokens, pad)
    empty = lengths == 0
    tokens[empty, 0] = EMPTY
    return tokens.astype(np.int64), np.maximum(lengths, 1)
