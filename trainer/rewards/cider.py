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

The ``cider-d`` reward (:class:`CiderDReward`, ``reward: {name: cider-d, cache:
FILE}``) scores with the cache the ``cider_df`` stage wrote (trainer/rewards/
cider_cache.py), refused when made from other data than the run trains on.
"""

from __future__ import annotations

import json
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from pipeline.captions.vocab import digest_words
from pipeline.core.atomic import atomic_file
from pipeline.core.errors import CapstackError
from pipeline.core.regular import open_regular
from trainer.rewards import REWARDS
from trainer.rewards.base import Reward

MAX_N = 4
SIGMA = 6.0
MAX_BASE = 2 ** 15  # BASE**4 * 4 must fit in int64
REBUILD = "rebuild it: capstack cider-cache"
_ARRAYS = {"ngrams": 1, "df": 1, "image_ids": 1, "ref_start": 1, "image_ngrams": 1,
           "image_ngram_weights": 2, "ref_norms": 2, "ref_lengths": 1}  # a cache's: dimensions


def ngram_counts(tokens: np.ndarray, lengths: np.ndarray,
                 base: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's distinct n-grams and their counts: (row, key, count), without a global sort.

    Per order n the [M, W] key matrix is sorted along its rows (invalid windows
    pushed to the end), and runs of equal keys are counted.
    """
    m, t = tokens.shape
    sentinel = np.iinfo(np.int64).max
    out_rows, out_keys, out_counts = [], [], []
    for n in range(1, MAX_N + 1):
        if t < n:
            break
        width = t - n + 1
        key = np.zeros((m, width), np.int64)
        for j in range(n):
            key += tokens[:, j:width + j].astype(np.int64) * base ** j
        key = key * MAX_N + (n - 1)
        key[np.arange(width)[None, :] + n > lengths[:, None]] = sentinel
        key.sort(axis=1)
        flat = key.ravel()
        boundary = np.ones(flat.shape, bool)
        boundary[1:] = flat[1:] != flat[:-1]
        boundary[::width] = True  # every row starts a run
        starts = np.flatnonzero(boundary)
        counts = np.diff(np.append(starts, flat.size))
        real = flat[starts] != sentinel
        out_rows.append(starts[real] // width)
        out_keys.append(flat[starts[real]])
        out_counts.append(counts[real].astype(np.float64))
    if not out_rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
    return np.concatenate(out_rows), np.concatenate(out_keys), np.concatenate(out_counts)


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
    image_ngrams: np.ndarray  # [P] sorted image index * G + n-gram index, for every image's n-grams
    image_ngram_weights: np.ndarray  # [P, Rmax] that n-gram's weight in each reference of the image
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
        ref_tokens, starts = [], [0]
        for image_id in image_ids:
            for caption in references[int(image_id)]:
                ref_tokens.append([ids.setdefault(w, len(ids)) for w in caption.split()])
            starts.append(len(ref_tokens))
        words = sorted(ids, key=ids.__getitem__)
        base = 1 << max(len(words) - 1, 1).bit_length()
        if base > MAX_BASE:
            raise CapstackError(f"CIDEr-D: {len(words)} distinct words in the references; the "
                                f"n-gram keys hold at most {MAX_BASE}")
        tokens, lengths = _padded(ref_tokens)
        ref_rows, keys, tf = ngram_counts(tokens, lengths, base)
        ref_start = np.array(starts, np.int64)
        ref_image = np.repeat(np.arange(len(image_ids)), np.diff(ref_start))
        ngrams, ngram_index = np.unique(keys, return_inverse=True)
        pairs = ref_image[ref_rows] * len(ngrams) + ngram_index  # (image, n-gram) of each count
        image_ngrams = sorted_unique(pairs)
        df = np.bincount(image_ngrams % len(ngrams), minlength=len(ngrams)).astype(np.float64)
        log_n = float(np.log(len(image_ids)))
        weights = tf * (log_n - np.log(np.maximum(1.0, df[ngram_index])))
        order = (keys % MAX_N).astype(np.int64)
        norms = np.sqrt(np.bincount(ref_rows * MAX_N + order, weights=weights ** 2,
                                    minlength=len(ref_tokens) * MAX_N)).reshape(-1, MAX_N)
        slot = np.searchsorted(image_ngrams, pairs)
        per_image = np.diff(ref_start)
        table = np.zeros((len(image_ngrams), per_image.max()), np.float64)
        table[slot, ref_rows - ref_start[ref_image[ref_rows]]] = weights
        return cls(words, len(vocab_words), base, log_n, ngrams, df, image_ids, ref_start,
                   image_ngrams, table, norms, np.maximum(lengths - 1, 0))

    # ------------------------------------------------------------------ scoring

    def score(self, image_ids: Sequence[int] | np.ndarray, tokens: np.ndarray,
              lengths: np.ndarray) -> np.ndarray:
        """CIDEr-D [M] of candidates tokens [M, T] (vocabulary ids, ``lengths`` words each)."""
        tokens, lengths = np.asarray(tokens), np.asarray(lengths)
        images = np.searchsorted(self.image_ids, np.asarray(image_ids, np.int64))
        known = (images < len(self.image_ids)) & (
            self.image_ids[np.minimum(images, len(self.image_ids) - 1)] == image_ids)
        if not known.all():
            missing = np.asarray(image_ids)[~known][0]
            raise CapstackError(f"CIDEr-D: image {missing} has no cached references")
        m = len(tokens)
        rows, keys, tf = ngram_counts(tokens, lengths, self.base)
        index = np.minimum(np.searchsorted(self.ngrams, keys), len(self.ngrams) - 1)
        found = self.ngrams[index] == keys
        df = np.where(found, self.df[index], 0.0)
        weights = tf * (self.log_n - np.log(np.maximum(1.0, df)))
        order = (keys % MAX_N).astype(np.int64)
        norms = np.sqrt(np.bincount(rows * MAX_N + order, weights=weights ** 2,
                                    minlength=m * MAX_N)).reshape(m, MAX_N)
        hyp_lengths = np.maximum(lengths - 1, 0)
        count = np.diff(self.ref_start)[images]  # references per candidate
        r_max = self.image_ngram_weights.shape[1]
        overlap = self._overlap(images, rows[found], index[found], weights[found], order[found],
                                m)  # [M, Rmax, 4]
        refs = np.minimum(self.ref_start[images][:, None] + np.arange(r_max),
                          len(self.ref_lengths) - 1)  # [M, Rmax] (past the image's own: masked)
        denominator = norms[:, None, :] * self.ref_norms[refs]  # [M, Rmax, 4]
        value = np.where(denominator != 0, overlap / np.where(denominator != 0, denominator, 1),
                         overlap)
        delta = (hyp_lengths[:, None] - self.ref_lengths[refs]).astype(np.float64)
        value = value * np.exp(-(delta ** 2) / (2 * SIGMA ** 2))[:, :, None]
        real = np.arange(r_max)[None, :] < count[:, None]
        return (value.mean(2) * real).sum(1) / count * 10.0

    def _overlap(self, images, rows, ngram_index, weights, order, m):
        """[M, Rmax, 4]: per candidate, reference of its image and order, sum of min(h, r) * r."""
        query = images[rows] * len(self.ngrams) + ngram_index
        at = np.minimum(np.searchsorted(self.image_ngrams, query), len(self.image_ngrams) - 1)
        present = self.image_ngrams[at] == query
        ref_weights = self.image_ngram_weights[at[present]]  # [F, Rmax]
        contribution = np.minimum(weights[present, None], ref_weights) * ref_weights
        r_max = ref_weights.shape[1]
        cell = (rows[present] * r_max)[:, None] + np.arange(r_max)  # [F, Rmax]
        flat = (cell * MAX_N + order[present][:, None]).ravel()
        return np.bincount(flat, weights=contribution.ravel(),
                           minlength=m * r_max * MAX_N).reshape(m, r_max, MAX_N)

    # ------------------------------------------------------------------ files

    def vocab_digest(self) -> str:
        return digest_words(self.words[:self.vocab_size])

    def save(self, path: str | Path) -> None:
        arrays = {k: getattr(self, k) for k in ("ngrams", "df", "image_ids", "ref_start",
                                                 "image_ngrams", "image_ngram_weights",
                                                 "ref_norms", "ref_lengths")}
        header = {"words": self.words, "vocab_size": self.vocab_size, "base": self.base,
                  "log_n": self.log_n, "vocab_md5": self.vocab_digest()}
        with atomic_file(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **arrays)

    @classmethod
    def load(cls, path: str | Path) -> "CiderD":
        """The cache at ``path``, each part checked (a damaged cache is named, and a file that
        is no .npz never reaches numpy's pickle fallback)."""
        try:
            with open_regular(path, "a CIDEr-D cache") as f:
                if f.read(2) != b"PK":  # a zip: what np.savez writes
                    raise CapstackError(f"{path}: not a CIDEr-D cache (not an .npz file); "
                                        f"{REBUILD}")
                f.seek(0)
                with np.load(f) as data:
                    header = json.loads(data["header"].tobytes())
                    arrays = {k: data[k] for k in data.files if k != "header"}
        except FileNotFoundError:
            raise CapstackError(f"{path}: CIDEr-D cache not found (run its stage: capstack "
                                f"cider-cache)") from None
        except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile,
                RecursionError) as error:
            raise CapstackError(f"{path}: not a CIDEr-D cache ({_unreadable(error)}); "
                                f"{REBUILD}") from None
        problem = _cache_problem(header, arrays)
        if problem:
            raise CapstackError(f"{path}: a damaged CIDEr-D cache ({problem}); {REBUILD}")
        return cls(header["words"], header["vocab_size"], header["base"], header["log_n"],
                   **arrays)


def _unreadable(error: BaseException) -> str:
    """Why numpy could not read a cache, in words that never suggest ``allow_pickle``."""
    text = str(error)
    if "allow_pickle" in text:
        return "it holds pickled Python objects, which capstack never loads"
    return text.splitlines()[0] if text else type(error).__name__


def _cache_problem(header, arrays: dict) -> str | None:
    """What is wrong with a loaded cache's header and arrays, or None: the types and the
    lengths that scoring relies on."""
    if not isinstance(header, dict):
        return "its header is not a mapping"
    words, size = header.get("words"), header.get("vocab_size")
    if not (isinstance(words, list) and all(isinstance(w, str) for w in words)):
        return "header.words: expected a list of words"
    if not (isinstance(size, int) and 0 < size <= len(words)):
        return f"header.vocab_size: expected 1 to {len(words)}, got {size!r}"
    base = header.get("base")
    if not (isinstance(base, int) and len(words) <= base <= MAX_BASE):
        return f"header.base: expected {len(words)} to {MAX_BASE}, got {base!r}"
    if not (isinstance(header.get("log_n"), (int, float)) and math.isfinite(header["log_n"])):
        return "header.log_n: expected a finite number"
    if set(arrays) != set(_ARRAYS):
        return f"expected the arrays {', '.join(sorted(_ARRAYS))}, found " \
               f"{', '.join(sorted(arrays)) or 'none'}"
    for name, ndim in _ARRAYS.items():
        if arrays[name].ndim != ndim or arrays[name].dtype.kind not in "iuf":
            return f"{name}: expected {ndim}-d numbers, got {arrays[name].dtype} of shape " \
                   f"{arrays[name].shape}"
    a = arrays
    if not (len(a["ngrams"]) == len(a["df"]) and len(a["ref_start"]) == len(a["image_ids"]) + 1
            and len(a["image_ngrams"]) == len(a["image_ngram_weights"])
            and len(a["ref_norms"]) == len(a["ref_lengths"]) and a["ref_norms"].shape[1] == MAX_N
            and len(a["ref_start"]) and a["ref_start"][-1] == len(a["ref_lengths"])):
        return "its arrays disagree in length"
    return None


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` by sorting. numpy 2.3+ finds unique values of an array without
    ``return_*`` through a hash set, superlinear on millions of distinct int64s (numpy issue
    31969: 1.9 s for 2M values, 9.6 s for 8M, where sorting takes 0.02 s and 0.1 s)."""
    values = np.sort(values, axis=None)
    keep = np.ones(values.shape, bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]


def _padded(token_lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([len(t) for t in token_lists], np.int64)
    tokens = np.zeros((len(token_lists), max(lengths.max(initial=0), 1)), np.int64)
    for k, t in enumerate(token_lists):
        tokens[k, :len(t)] = t
    return tokens, lengths


def cider_reward(path: str, captions) -> CiderD:
    """The cached CIDEr-D references of ``path``, refused when made from other data than the
    prepared ``captions`` trained on (another vocabulary, or a train split it lacks)."""
    scorer = CiderD.load(path)
    if scorer.vocab_digest() != captions.vocab.digest():
        raise CapstackError(f"{path}: built with another vocabulary than {captions.folder} "
                            f"(rebuild it: capstack cider-cache)")
    lacking = np.setdiff1d(captions.image_ids[captions.rows("train")], scorer.image_ids)
    if len(lacking):
        raise CapstackError(f"{path}: has no references for image {lacking[0]} of "
                            f"{captions.folder}'s train split (another dataset?)")
    return scorer


@dataclass
class CiderDConfig:
    cache: str  # the `capstack cider-cache` file of the train split (the cider_df stage)


@REWARDS.register("cider-d")
class CiderDReward(Reward):
    """CIDEr-D (coco-caption's) against the train references cached by `capstack cider-cache`."""

    Config = CiderDConfig

    def __init__(self, config: CiderDConfig, captions):
        super().__init__(config, captions)
        self.scorer = cider_reward(config.cache, captions)

    def score(self, image_ids, tokens, lengths) -> np.ndarray:
        return self.scorer.score(image_ids, tokens, lengths)
