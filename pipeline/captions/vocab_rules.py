"""Which words a vocabulary keeps, and in which order: a rule chosen by name at ``prepare``.

``capstack`` (the default)
    Words of the train split (``restval`` counts as train) seen at least ``min_count``
    times, by count (descending), ties alphabetical.
``rtl``
    self-critical.pytorch's ``scripts/prepro_labels.py`` (neuraltalk2's ``prepro.py``
    before it): words of **every** split seen **more than** ``min_count`` times (its
    ``word_count_threshold``), in the order they are first seen, images and captions in
    the json's order. Its ``UNK`` is capstack's ``<unk>``. Use it to reproduce the peer's
    vocabulary (and its published 9,487 words on Karpathy COCO at threshold 5); it counts
    the test captions' words, which the default does not.

Either way a word spelled like a special token (``<eos>``) is never kept
(pipeline/captions/vocab.py).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

from pipeline.captions.karpathy import KarpathyDataset
from pipeline.captions.vocab import SPECIALS, Vocabulary
from pipeline.core.registry import Registry

VOCAB_RULES = Registry("vocabulary rule")
DEFAULT_RULE = "capstack"

Rule = Callable[[KarpathyDataset, int], Vocabulary]


@VOCAB_RULES.register("capstack")
def train_words_by_count(dataset: KarpathyDataset, min_count: int) -> Vocabulary:
    """Train-split words seen at least min_count times, by count, ties alphabetical."""
    counts = Counter(t for im in dataset.split("train") for s in im.sentences for t in s.tokens)
    kept = sorted((w for w, c in counts.items() if c >= min_count and w not in SPECIALS),
                  key=lambda w: (-counts[w], w))
    return Vocabulary(kept, {w: counts[w] for w in kept}, min_count, rule="capstack")


@VOCAB_RULES.register("rtl")
def all_words_first_seen(dataset: KarpathyDataset, min_count: int) -> Vocabulary:
    """prepro_labels.py's: words of every split seen more than min_count times, first seen first."""
    counts: dict[str, int] = {}
    for image in dataset.images:
        for sentence in image.sentences:
            for token in sentence.tokens:
                counts[token] = counts.get(token, 0) + 1
    kept = [w for w, c in counts.items() if c > min_count and w not in SPECIALS]
    return Vocabulary(kept, {w: counts[w] for w in kept}, min_count, rule="rtl")


def build_vocabulary(rule: str, dataset: KarpathyDataset, min_count: int) -> Vocabulary:
    return VOCAB_RULES.get(rule)(dataset, min_count)
