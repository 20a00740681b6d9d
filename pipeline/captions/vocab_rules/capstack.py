"""``capstack`` (the default): train-split words seen at least ``min_count`` times, by count."""

from __future__ import annotations

from collections import Counter

from pipeline.captions.karpathy import KarpathyDataset
from pipeline.captions.vocab import SPECIALS, Vocabulary
from pipeline.captions.vocab_rules import VOCAB_RULES


@VOCAB_RULES.register("capstack")
def train_words_by_count(dataset: KarpathyDataset, min_count: int) -> Vocabulary:
    """Train-split words seen at least min_count times, by count, ties alphabetical."""
    counts = Counter(t for im in dataset.split("train") for s in im.sentences for t in s.tokens)
    kept = sorted((w for w, c in counts.items() if c >= min_count and w not in SPECIALS),
                  key=lambda w: (-counts[w], w))
    return Vocabulary(kept, {w: counts[w] for w in kept}, min_count, rule="capstack")
