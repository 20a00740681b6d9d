"""CIDEr-D of token-id captions, vectorised with numpy, against cached references.

The same arithmetic as pycocoevalcap's ``CiderScorer`` (the coco-caption
CIDEr-D): n-grams 1..4, tf-idf weights ``tf * (log N - log max(1, df))`` with
``df`` counted over images, per-order cosine with the hypothesis weight clipped
at the reference's (``min(h, r) * r``), a Gaussian length penalty with sigma 6
on the difference of *bigram* counts (pycocoevalcap counts ``length`` on
order-2 n-grams), the mean over orders, the mean over references, times 10.

Everything about the references (the n-gram vocabulary, document frequencies,
every reference's weights, norms and lengths) is computed once
(:meth:`CiderD.from_references`) and saved (:meth:`CiderD.save`); scoring a
batch of sampled captions then only extracts the candidates' n-grams and looks
them up: no re-tokenising and no per-call work on the references.

N-grams are int64 keys: ``sum_j w_j * BASE**j`` times 4 plus the order - 1,
with ``BASE`` a power of two above the number of distinct words (at most
2**15). Reference words outside the captioning vocabulary get ids of their own
above it, so they never match a candidate word (``<unk>`` included).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from pipeline.atomic import atomic_file
from pipeline.errors import CapstackError

MAX_N = 4
SIGMA = 6.0
MAX_BASE = 2 ** 15  # BASE**4 * 4 must fit in int64


def ngram_keys(tokens: np.ndarray, lengths: np.ndarray, base: int) -> tuple[np.ndarray, np.ndarray]:
    """Every n-gram (n = 1..4) of each row: (row index, key), keys encoding the order too.

    tokens [M, T] int64 word ids, lengths [M] (words per row; the rest is ignored).
    """
    m, t = tokens.shape
    rows_out, keys_out = [], []
    for n in range(1, MAX_N + 1):
        if t < n:
            break
        key = np.zeros((m, t - n + 1), np.int64)
        for j in range(n):
            key += tokens[:, j:t - n + 1 + j].astype(np.int64) * base ** j
        valid = np.arange(t - n + 1)[None, :] + n <= lengths[:, None]
        rows_out.append(np.nonzero(valid)[0])
        keys_out.append(key[valid] * MAX_N + (n - 1))
    if not rows_out:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(rows_out), np.concatenate(keys_out)


def counted(rows: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (row, key) pairs and how often each occurs."""
    if len(rows) == 0:
        return rows, keys, np.zeros(0, np.float64)
    order = np.lexsort((keys, rows))
    rows, keys = rows[order], keys[order]
    start = np.ones(len(rows), bool)
    start[1:] = (rows[1:] != rows[:-1]) | (keys[1:] != keys[:-1])
    index = np.flatnonzero(start)
    counts = np.diff(np.append(index, len(rows))).astype(np.float64)
    return rows[index], keys[index], counts


@dataclass
class CiderD:
    """Cached references of a dataset split, and the scorer of candidates against them."""

    words: list[str]  # id -> word: the captioning vocabulary, then reference-only words
    vocab_size: int  # the first vocab_size words are the captioning vocabulary
    base: int
    log_n: float  # log of the number of images (pycocoevalcap's ref_len)
    ngrams: np.ndarray  # [G] sorted n-gram keys seen in the references
    df: np.ndarray  # [G] images whose references contain the n-gram
    image_ids: np.ndarray  # [I]
    ref_start: np.ndarray  # [I + 1] each image's references: ref_start[i]..ref_start[i+1]
    entry_keys: np.ndarray  # [E] sorted ref * G + ngram index
    entry_weights: np.ndarray  # [E] the reference's tf-idf weight of that n-gram
    ref_norms: np.ndarray  # [R, 4]
    ref_lengths: np.ndarray  # [R] bigram counts

    # ------------------------------------------------------------------ building

    @classmethod
    def from_references(cls, references: Mapping[int, Sequence[str]],
                        vocab_words: Sequence[str]) -> "CiderD":
        """``references``: image id -> tokenized captions (space-separated words)."""
        if not references:
            raise CapstackError("CIDEr-D: no references to build document frequencies from")
        words = list(vocab_words)
        ids = {w: i for i, w in enumerate(words)}
        image_ids = np.array(sorted(references), np.int64)
        ref_tokens, ref_start = [], [0]
        for image_id in image_ids:
            for caption in references[int(image_id)]:
                ref_tokens.append([ids.setdefault(w, len(ids)) for w in caption.split()])
            ref_start.append(len(ref_tokens))
        words = sorted(ids, key=ids.get)
        base = 1 << max(len(words) - 1, 1).bit_length()
        if base > MAX_BASE:
            raise CapstackError(f"CIDEr-D: {len(words)} distinct words in the references; the "
                                f"n-gram keys hold at most {MAX_BASE}")
        tokens, lengths = _padded(ref_tokens)
        ref_rows, keys = ngram_keys(tokens, lengths, base)
        ref_rows, keys, tf = counted(ref_rows, keys)
        ref_start = np.array(ref_start, np.int64)
        ref_image = np.repeat(np.arange(len(image_ids)), np.diff(ref_start))
        ngrams, ngram_index = np.unique(keys, return_inverse=True)
        image_ngram = np.unique(ref_image[ref_rows] * len(ngrams) + ngram_index)
        df = np.bincount(image_ngram % len(ngrams), minlength=len(ngrams)).astype(np.float64)
        log_n = float(np.log(len(image_ids)))
        weights = tf * (log_n - np.log(np.maximum(1.0, df[ngram_index])))
        order = (keys % MAX_N).astype(np.int64)
        norms = np.sqrt(np.bincount(ref_rows * MAX_N + order, weights=weights ** 2,
                                    minlength=len(ref_tokens) * MAX_N)).reshape(-1, MAX_N)
        entry_keys = ref_rows * len(ngrams) + ngram_index
        sort = np.argsort(entry_keys)
        return cls(words, len(vocab_words), base, log_n, ngrams, df, image_ids, ref_start,
                   entry_keys[sort], weights[sort], norms, np.maximum(lengths - 1, 0))

    # ------------------------------------------------------------------ scoring

    def score(self, image_ids: Sequence[int], tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """CIDEr-D [M] of candidates tokens [M, T] (vocabulary ids, ``lengths`` words each)."""
        tokens, lengths = np.asarray(tokens), np.asarray(lengths)
        images = np.searchsorted(self.image_ids, np.asarray(image_ids, np.int64))
        known = (images < len(self.image_ids)) & (
            self.image_ids[np.minimum(images, len(self.image_ids) - 1)] == image_ids)
        if not known.all():
            missing = np.asarray(image_ids)[~known][0]
            raise CapstackError(f"CIDEr-D: image {missing} has no cached references")
        m = len(tokens)
        rows, keys = ngram_keys(tokens, lengths, self.base)
        rows, keys, tf = counted(rows, keys)
        index = np.minimum(np.searchsorted(self.ngrams, keys), len(self.ngrams) - 1)
        found = self.ngrams[index] == keys
        df = np.where(found, self.df[index], 0.0)
        weights = tf * (self.log_n - np.log(np.maximum(1.0, df)))
        order = (keys % MAX_N).astype(np.int64)
        norms = np.sqrt(np.bincount(rows * MAX_N + order, weights=weights ** 2,
                                    minlength=m * MAX_N)).reshape(m, MAX_N)
        hyp_lengths = np.maximum(lengths - 1, 0)
        # every (candidate, reference of its image) pair: a slot
        first, count = self.ref_start[images], np.diff(self.ref_start)[images]
        slot_start = np.concatenate([[0], np.cumsum(count)])
        slot_row = np.repeat(np.arange(m), count)
        slot_ref = first[slot_row] + np.arange(len(slot_row)) - slot_start[slot_row]
        overlap = self._overlap(rows[found], index[found], weights[found], order[found],
                                count, first, slot_start, len(slot_row))
        denominator = norms[slot_row] * self.ref_norms[slot_ref]  # [S, 4]
        value = np.where(denominator != 0, overlap / np.where(denominator != 0, denominator, 1),
                         overlap)
        delta = (hyp_lengths[slot_row] - self.ref_lengths[slot_ref]).astype(np.float64)
        value = value * np.exp(-(delta ** 2) / (2 * SIGMA ** 2))[:, None]
        per_slot = value.mean(1)
        return np.bincount(slot_row, weights=per_slot, minlength=m) / count * 10.0

    def _overlap(self, rows, ngram_index, weights, order, count, first, slot_start, slots):
        """[S, 4]: per (candidate, reference) slot and order, sum of min(h, r) * r."""
        repeat = count[rows]
        entry = np.repeat(np.arange(len(rows)), repeat)
        local = np.arange(len(entry)) - np.repeat(np.cumsum(repeat) - repeat, repeat)
        ref = first[rows][entry] + local
        query = ref * len(self.ngrams) + ngram_index[entry]
        at = np.minimum(np.searchsorted(self.entry_keys, query), len(self.entry_keys) - 1)
        ref_weight = np.where(self.entry_keys[at] == query, self.entry_weights[at], 0.0)
        contribution = np.minimum(weights[entry], ref_weight) * ref_weight
        slot = slot_start[rows][entry] + local
        return np.bincount(slot * MAX_N + order[entry], weights=contribution,
                           minlength=slots * MAX_N).reshape(slots, MAX_N)

    # ------------------------------------------------------------------ files

    def vocab_digest(self) -> str:
        return hashlib.md5(json.dumps(self.words[:self.vocab_size]).encode()).hexdigest()

    def save(self, path: str | Path) -> None:
        arrays = {k: getattr(self, k) for k in ("ngrams", "df", "image_ids", "ref_start",
                                                 "entry_keys", "entry_weights", "ref_norms",
                                                 "ref_lengths")}
        header = {"words": self.words, "vocab_size": self.vocab_size, "base": self.base,
                  "log_n": self.log_n, "vocab_md5": self.vocab_digest()}
        with atomic_file(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)

    @classmethod
    def load(cls, path: str | Path) -> "CiderD":
        try:
            with np.load(path) as data:
                header = json.loads(data["header"].tobytes())
                arrays = {k: data[k] for k in data.files if k != "header"}
        except FileNotFoundError:
            raise CapstackError(f"{path}: CIDEr-D cache not found (run its stage: capstack "
                                f"cider-cache)") from None
        except (ValueError, KeyError, OSError) as error:
            raise CapstackError(f"{path}: not a CIDEr-D cache ({error})") from None
        return cls(header["words"], header["vocab_size"], header["base"], header["log_n"],
                   **arrays)


def _padded(token_lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([len(t) for t in token_lists], np.int64)
    tokens = np.zeros((len(token_lists), max(lengths.max(initial=0), 1)), np.int64)
    for k, t in enumerate(token_lists):
        tokens[k, :len(t)] = t
    return tokens, lengths
